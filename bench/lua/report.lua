-- wrk script used by every veloxy bench run.
-- Env: WRK_METHOD (default GET), WRK_BODY_FILE (request body, optional),
--      WRK_CONTENT_TYPE (default application/json).
-- At the end it prints one line "WRKJSON {...}" that the harness parses.

local method = os.getenv("WRK_METHOD")
if method and method ~= "" then
  wrk.method = method
end
local body_file = os.getenv("WRK_BODY_FILE")
if body_file and body_file ~= "" then
  local f = assert(io.open(body_file, "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.headers["Content-Type"] = os.getenv("WRK_CONTENT_TYPE") or "application/json"
end

function done(summary, latency, requests)
  local e = summary.errors
  local p = {}
  for _, q in ipairs({50, 75, 90, 99, 99.9}) do
    p[#p + 1] = string.format('"p%s":%d', tostring(q), latency:percentile(q))
  end
  io.write(string.format(
    'WRKJSON {"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"stdev":%.1f,"max":%d,%s}}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.stdev, latency.max, table.concat(p, ",")))
end
