-- wrk script for `bench/run --cache`, case mix-90 (bench/harness/cache.py): a 90%-hit mix.
-- Every WRK_CACHE_MISS_EVERY-th request (default 10th) asks for a key seen by no one before,
-- BASE?miss=NONCE-THREAD-COUNTER (a cold miss: the proxy fetches it from the upstream and
-- stores it); the others cycle over WRK_CACHE_KEYS warm keys (default 16), BASE?k=0..15, which
-- the harness has fetched before the run. BASE = WRK_CACHE_PATH (default /size/1000: the
-- upstream answers 1000 bytes whatever the query). WRK_CACHE_NONCE is new for every run (the
-- warm-up too), so a later round never finds the misses of an earlier one in the cache.
-- The summary line (WRKJSON) comes from report.lua, loaded from this script's directory.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "report.lua")

local nonce = os.getenv("WRK_CACHE_NONCE") or tostring(os.time())
local every = tonumber(os.getenv("WRK_CACHE_MISS_EVERY") or "") or 10
local nkeys = tonumber(os.getenv("WRK_CACHE_KEYS") or "") or 16
local base = os.getenv("WRK_CACHE_PATH") or "/size/1000"

local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local warm = {}
local counter = 0

function init(args)
  for i = 0, nkeys - 1 do
    warm[i] = wrk.format("GET", base .. "?k=" .. i)
  end
end

function request()
  counter = counter + 1
  if counter % every == 0 then
    return wrk.format("GET", string.format("%s?miss=%s-%d-%d", base, nonce, tid or 0, counter))
  end
  return warm[counter % nkeys]
end
