-- wrk script for `bench/run --vs-nginx --ratelimit` (bench/harness/ratelimit.py): every request
-- carries a rate-limit key header, WRK_RL_HEADER (default x-key): "k0", "k1", ... cycling over
-- WRK_RL_KEYS keys (default 48), so each key gets 1/WRK_RL_KEYS of the requests. Each wrk thread
-- starts at another key. The requests are formatted once (in init), so the script costs wrk
-- nothing per request beyond picking the next one; the headers given with -H are kept.
-- The summary line (WRKJSON) comes from report.lua, loaded from this script's directory.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "report.lua")

local nkeys = tonumber(os.getenv("WRK_RL_KEYS") or "") or 48
local header = os.getenv("WRK_RL_HEADER") or "x-key"
if nkeys < 1 then nkeys = 1 end

local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local reqs = {}
local counter = 0

function init(args)
  for i = 0, nkeys - 1 do
    local h = {}
    for k, v in pairs(wrk.headers) do
      h[k] = v
    end
    h[header] = "k" .. i
    reqs[i] = wrk.format(nil, nil, h)
  end
  counter = (tid or 0) * 7
end

function request()
  counter = counter + 1
  return reqs[counter % nkeys]
end
