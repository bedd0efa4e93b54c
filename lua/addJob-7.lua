--[[
  addJob: create a job hash and make the job ready (wait or prioritized),
  paused or delayed.

  KEYS[1] wait      LIST
  KEYS[2] paused    LIST
  KEYS[3] meta      HASH   (field `paused` present = queue paused)
  KEYS[4] id        STRING counter for generated ids
  KEYS[5] delayed   ZSET   score = due time (ms)
  KEYS[6] marker    ZSET   wakes blocked workers
  KEYS[7] prioritized ZSET ready jobs with a priority

  ARGV[1] key prefix of the queue, e.g. "emq:{default}:"
  ARGV[2] job id chosen by the caller, or "" to generate one (INCR KEYS[4])
  ARGV[3] name
  ARGV[4] data (JSON text)
  ARGV[5] opts (JSON text)
  ARGV[6] timestamp, ms
  ARGV[7] delay, ms (0 = ready now)
  ARGV[8] priority, -100..100 (0 = none; higher runs first)

  Returns {id, 1} when the job was added, {id, 0} when a job with the
  caller's id already exists (nothing is changed: adding is idempotent).
]]
-- @include "emitEvent"
-- @include "pushReady"

local prefix = ARGV[1]
local id = ARGV[2]
if id == "" then
  id = tostring(redis.call("INCR", KEYS[4]))
elseif redis.call("EXISTS", prefix .. id) == 1 then
  return {id, 0}
end

local timestamp = tonumber(ARGV[6])
local delay = tonumber(ARGV[7])
redis.call("HSET", prefix .. id, "name", ARGV[3], "data", ARGV[4], "opts", ARGV[5],
  "timestamp", timestamp, "atm", 0, "ats", 0, "stc", 0)
if tonumber(ARGV[8]) ~= 0 then
  redis.call("HSET", prefix .. id, "pri", ARGV[8])
end

if delay > 0 then
  redis.call("ZADD", KEYS[5], timestamp + delay, id)
  -- Wake one worker so it shortens its sleep to this job's due time.
  redis.call("ZADD", KEYS[6], 0, "0")
  emitEvent(prefix, "delayed", id, "due", timestamp + delay)
else
  pushReady(prefix, KEYS[1], KEYS[2], KEYS[3], KEYS[6], KEYS[7], id)
  emitEvent(prefix, "added", id)
end
return {id, 1}
