-- wrk script for `bench/run --scale` (bench/harness/scale.py): requests spread uniformly over a
-- generated route table. WRK_SCALE_TARGETS names a file with one route a line, "HOST PATH"
-- (written by the harness from the same list as the proxies' configs); every request picks
-- one line at random (uniform over the routes, so over the hosts too: each host has the same
-- number of paths) and sends GET PATH with that Host. The requests are formatted once (in
-- init), so the per-request cost in wrk is a random number and a table lookup.
-- Status counts: every answer's status is counted (200 and the others); done() writes them as
-- JSON to WRK_SCALE_STATUS (if set): {"ok":N,"other":N,"codes":{"404":N,...}}.
-- The summary line (WRKJSON) comes from report.lua, loaded from this script's directory.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "report.lua")
local report_done = done

local targets_file = os.getenv("WRK_SCALE_TARGETS") or error("WRK_SCALE_TARGETS is not set")
local status_file = os.getenv("WRK_SCALE_STATUS") or ""

local threads = {}
function setup(thread)
  threads[#threads + 1] = thread
  thread:set("tid", #threads)
end

local reqs = {}
local n = 0
ok = 0
other = 0
codes = {}

function init(args)
  for line in io.lines(targets_file) do
    local host, path = line:match("^(%S+)%s+(%S+)$")
    if host then
      n = n + 1
      reqs[n] = wrk.format("GET", path, { Host = host })
    end
  end
  if n == 0 then
    error("no target in " .. targets_file)
  end
  math.randomseed(os.time() * 1000 + (tid or 0) * 7919)
end

function request()
  return reqs[math.random(n)]
end

function response(status, headers, body)
  if status == 200 then
    ok = ok + 1
  else
    other = other + 1
    codes[status] = (codes[status] or 0) + 1
  end
end

function done(summary, latency, requests)
  report_done(summary, latency, requests)
  if status_file == "" then
    return
  end
  local tok, toth, all = 0, 0, {}
  for _, t in ipairs(threads) do
    tok = tok + (t:get("ok") or 0)
    toth = toth + (t:get("other") or 0)
    for k, v in pairs(t:get("codes") or {}) do
      all[k] = (all[k] or 0) + v
    end
  end
  local parts = {}
  for k, v in pairs(all) do
    parts[#parts + 1] = string.format('"%s":%d', tostring(k), v)
  end
  local f = assert(io.open(status_file, "w"))
  f:write(string.format('{"ok":%d,"other":%d,"codes":{%s}}\n', tok, toth, table.concat(parts, ",")))
  f:close()
end
