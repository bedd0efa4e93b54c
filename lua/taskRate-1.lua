--[[
  taskRate: one start of a job whose function has a rate limit of its own
  (echomq_django.celery's rate_limit), decided for every worker of the queue
  at once. Starts are spaced evenly, `window_ms / max` apart, as Celery's token
  bucket spaces them in one worker: the next free start time is kept under
  `tat`. A job that comes too soon is given the next free start and holds it
  (`r:<id>`): the worker postpones it to then, and when it comes back it
  starts without asking again. Its keys all share the queue's hash tag.

  KEYS[1] task-rate:<name>  HASH  "tat", and "r:<id>" for each job holding a start

  ARGV[1] max        starts allowed per window
  ARGV[2] window_ms  the window, ms
  ARGV[3] job_id

  Returns 0 when the job may start now, else the ms until its start. The
  hash expires once no start is held (a window after the last one).
]]
-- @include "lockIndex"

local id = ARGV[3]
local interval = tonumber(ARGV[2]) / tonumber(ARGV[1])
local now = redisNowMs()
local fields = redis.pcall("HMGET", KEYS[1], "tat", "r:" .. id)
if fields["err"] then return 0 end  -- another client's key of another type: no limit rather than no start
-- A number no script writes (another client's: nan, inf, far off) counts as none.
local function sane(value)
  local number = tonumber(value)
  if number and number == number and math.abs(number - now) < 1e12 then return number end
  return nil
end
local held = sane(fields[2])
if held then
  if held <= now then
    redis.call("HDEL", KEYS[1], "r:" .. id)
    return 0
  end
  return math.ceil(held - now)
end
local tat = sane(fields[1]) or now
if tat <= now then
  redis.call("HSET", KEYS[1], "tat", now + interval)
  redis.call("PEXPIRE", KEYS[1], math.ceil(interval + tonumber(ARGV[2])))
  return 0
end
redis.call("HSET", KEYS[1], "tat", tat + interval, "r:" .. id, tat)
redis.call("PEXPIRE", KEYS[1], math.ceil(tat + interval - now + tonumber(ARGV[2])))
return math.ceil(tat - now)
