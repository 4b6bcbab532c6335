# The message_bus gem's MessageBus::HTTPClient taking a burst, for perf/bench_client.py.
#
# ruby _ruby_burst_client.rb BASE_URL CHANNEL LAST_ID COUNT
# Subscribes to CHANNEL after LAST_ID, prints "ready" once started, counts messages and prints "done" at COUNT.
# MESSAGE_BUS_GEM_DIR names the gem's checkout (the client needs only Ruby's standard library).
$LOAD_PATH.unshift(File.join(ENV.fetch("MESSAGE_BUS_GEM_DIR"), "lib"))
require "message_bus/http_client"

$stdout.sync = true
base_url, channel, last_id, count = ARGV
want = Integer(count)
got = 0
done = Queue.new
client = MessageBus::HTTPClient.new(base_url, min_poll_interval: 0.1, max_poll_interval: 1)
client.subscribe(channel, last_message_id: Integer(last_id)) do |_data, _id, _global_id|
  got += 1
  done << true if got == want
end
client.start
puts "ready"
done.pop
puts "done"
client.stop
