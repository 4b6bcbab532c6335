# A Ruby process on the message_bus gem's own postgres backend, driven line by line by
# tests/postgres/test_pg_bridge.py::test_the_ruby_gem_itself.
#
# Environment: MESSAGE_BUS_GEM_DIR (a checkout of the gem: its lib/ is loaded), MB_CONNINFO (a libpq
# conninfo string; its search_path selects the test's schema), MB_DB (the gem's :db option, so its
# notify channel is "_message_bus_<MB_DB>"). Needs Ruby's pg and rack libraries (Debian: ruby-pg, ruby-rack).
#
# Commands on stdin, one JSON array a line; each answer is one JSON line on stdout:
#   ["publish", channel, data, opts]      -> {"id": <the id the gem's backend returned>}
#   ["received", channel, count, timeout] -> {"received": [[global_id, message_id, data, user_ids, site_id], ...]}
#   ["backlog", channel, last_id]         -> {"backlog": [[message_id, data, user_ids], ...], "last_id": n}
#   ["quit"]
$LOAD_PATH.unshift(File.join(ENV.fetch("MESSAGE_BUS_GEM_DIR"), "lib"))
require "json"
require "logger"
require "timeout"
require "message_bus"

$stdout.sync = true

MessageBus.configure(
  backend: :postgres,
  backend_options: ENV.fetch("MB_CONNINFO"),
  db: ENV.fetch("MB_DB"),
  logger: Logger.new($stderr),
  keepalive_interval: 0,
)

received = Hash.new { |hash, key| hash[key] = [] }
lock = Mutex.new
ready = Queue.new

MessageBus.subscribe("/__gem_ready") { |_m| ready << true }
MessageBus.subscribe("/interop") do |m|
  lock.synchronize { received[m.channel] << [m.global_id, m.message_id, m.data, m.user_ids, m.site_id] }
end

# The subscriber thread LISTENs asynchronously: publish a probe until our own subscriber hears one.
heard = false
50.times do
  MessageBus.publish("/__gem_ready", "probe")
  begin
    Timeout.timeout(0.2) { ready.pop }
    heard = true
    break
  rescue Timeout::Error
    next
  end
end
abort("the gem's subscriber never heard its own probe") unless heard
puts JSON.generate({ "ready" => true })

$stdin.each_line do |line|
  command, *args = JSON.parse(line)
  case command
  when "publish"
    channel, data, opts = args
    opts = (opts || {}).transform_keys(&:to_sym)
    puts JSON.generate({ "id" => MessageBus.publish(channel, data, opts) })
  when "received"
    channel, count, timeout = args
    deadline = Time.now + timeout
    sleep 0.02 while lock.synchronize { received[channel].size } < count && Time.now < deadline
    puts JSON.generate({ "received" => lock.synchronize { received[channel].dup } })
  when "backlog"
    channel, last_id = args
    backlog = MessageBus.backlog(channel, last_id).map { |m| [m.message_id, m.data, m.user_ids] }
    puts JSON.generate({ "backlog" => backlog, "last_id" => MessageBus.last_id(channel) })
  when "quit"
    break
  end
end
MessageBus.destroy
