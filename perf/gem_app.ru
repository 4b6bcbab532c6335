# The ordinary app of perf/_http_apps.py on the message_bus gem, for the HTTP benchmarks' same-run baseline:
# the gem's middleware with user, group, site and extra-header lookups wrapping a Rack app whose POST /publish
# calls MessageBus.publish. Memory backend (one process: run puma in single mode), or with MB_PG_DB=<database>
# the PostgreSQL backend on 127.0.0.1:5432 (puma in cluster mode: its workers share the bus through it).
# Environment: MESSAGE_BUS_GEM_DIR (the gem's checkout), MB_MAX_ACTIVE (max_active_clients), MB_BROADCAST=1
# (allow_broadcast), MB_POLL_MS (long_polling_interval, ms).
$LOAD_PATH.unshift File.join(ENV.fetch("MESSAGE_BUS_GEM_DIR"), "lib")
require "logger"
require "message_bus"

if ENV["MB_PG_DB"]
  MessageBus.configure(
    backend: :postgres,
    backend_options: { host: "127.0.0.1", port: 5432, dbname: ENV["MB_PG_DB"], user: ENV.fetch("MB_PG_USER", "postgres") }
  )
else
  MessageBus.configure(backend: :memory)
end
MessageBus.logger = Logger.new(nil)
MessageBus.max_active_clients = Integer(ENV.fetch("MB_MAX_ACTIVE", "20000"))
MessageBus.long_polling_interval = Integer(ENV.fetch("MB_POLL_MS", "120000"))
MessageBus.configure(allow_broadcast: ENV["MB_BROADCAST"] == "1")

SITE = "s1"
CLIENT = %r{/message-bus/[^/]*x(\d+)/}

def bench_user(env)
  m = CLIENT.match(env["PATH_INFO"])
  m && m[1].to_i
end

MessageBus.user_id_lookup { |env| bench_user(env) }
MessageBus.group_ids_lookup do |env|
  user = bench_user(env)
  user ? [0, 1 + user % 8] : [0]
end
MessageBus.site_id_lookup { |_env| SITE }
MessageBus.extra_response_headers_lookup { |_env| { "x-bench-app" => "ordinary" } }

app = lambda do |env|
  req = Rack::Request.new(env)
  if req.post? && req.path_info == "/publish"
    group = req.params["group"]
    opts = { site_id: SITE }
    opts[:group_ids] = [Integer(group)] if group
    MessageBus.publish(req.params["channel"], req.params["data"], **opts)
    [200, { "content-type" => "text/html" }, ["sent"]]
  else
    [404, { "content-type" => "text/plain" }, ["not found"]]
  end
end

use MessageBus::Rack::Middleware
run app
