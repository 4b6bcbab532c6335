# The message_bus gem's own server (memory backend, no Redis) for tests/client: run under puma by servers.py.
#
# Environment: MESSAGE_BUS_GEM_DIR (the gem's checkout), MB_LONG_POLLING_MS (default 1000), MB_LONG_POLLING and
# MB_CHUNKED ("0" turns them off). Who is asking comes from the X-User-Id and X-Group-Ids (comma-separated)
# headers. POST /publish {"channel", "data", "user_ids", "group_ids", "client_ids"} publishes and answers the id.
$LOAD_PATH.unshift(File.join(ENV.fetch("MESSAGE_BUS_GEM_DIR"), "lib"))
require "json"
require "logger"
require "message_bus"

MessageBus.configure(backend: :memory)
MessageBus.logger = Logger.new($stderr, level: Logger::WARN)
MessageBus.long_polling_interval = Integer(ENV.fetch("MB_LONG_POLLING_MS", "1000"))
MessageBus.long_polling_enabled = ENV["MB_LONG_POLLING"] != "0"
MessageBus.chunked_encoding_enabled = ENV["MB_CHUNKED"] != "0"
MessageBus.user_id_lookup { |env| env["HTTP_X_USER_ID"]&.to_i }
MessageBus.group_ids_lookup { |env| (env["HTTP_X_GROUP_IDS"] || "").split(",").map(&:to_i) }

app = lambda do |env|
  if env["REQUEST_METHOD"] == "POST" && env["PATH_INFO"] == "/publish"
    body = JSON.parse(env["rack.input"].read)
    opts = {}
    %w[user_ids group_ids client_ids].each { |k| opts[k.to_sym] = body[k] if body[k] }
    id = MessageBus.publish(body["channel"], body["data"], opts)
    [200, { "content-type" => "application/json" }, [JSON.generate(id)]]
  else
    [200, { "content-type" => "text/plain" }, ["ok"]]
  end
end

use MessageBus::Rack::Middleware
run app
