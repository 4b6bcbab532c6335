# The message_bus gem's own MessageBus::HTTPClient, driven by tests/web/test_ruby_client.py::test_the_gems_http_client.
#
# ruby gem_http_client.rb BASE_URL LONG_POLL(0|1) CHUNKED(0|1) COUNT
# Subscribes to "/ruby" from id 0 (its backlog, then live) and to "/ruby2" from the current position (-1: the
# server's /__status), prints each message as one JSON line [channel, data, global_id, message_id], and exits
# after COUNT messages. MESSAGE_BUS_GEM_DIR names the gem's checkout; the client needs only Ruby's standard library.
$LOAD_PATH.unshift(File.join(ENV.fetch("MESSAGE_BUS_GEM_DIR"), "lib"))
require "json"
require "message_bus/http_client"

$stdout.sync = true
base_url, long_poll, chunked, count = ARGV
client = MessageBus::HTTPClient.new(
  base_url,
  enable_long_polling: long_poll == "1",
  enable_chunked_encoding: chunked == "1",
  min_poll_interval: 0.05,
  max_poll_interval: 1,
  background_callback_interval: 0.05, # the polling interval without long polling
)
got = Queue.new
client.subscribe("/ruby", last_message_id: 0) { |data, id, global_id| got << ["/ruby", data, global_id, id] }
client.subscribe("/ruby2") { |data, id, global_id| got << ["/ruby2", data, global_id, id] }
client.start
Integer(count).times { puts JSON.generate(got.pop) }
client.stop
