--[[
  cancelJob: stop a job that has not started from ever starting: take it out
  of wait, paused, prioritized or delayed and put it in failed, with the
  reason, as a final failure (retryJob can still send it back). A job that a
  worker has already taken is left alone: it is no longer in any of those
  states, and the take and the cancel cannot interleave.

  KEYS[1] wait        LIST
  KEYS[2] paused      LIST
  KEYS[3] delayed     ZSET
  KEYS[4] prioritized ZSET
  KEYS[5] failed      ZSET

  ARGV[1] key prefix of the queue
  ARGV[2] job id
  ARGV[3] reason, recorded as the job's failedReason
  ARGV[4] now, ms

  Returns 1 cancelled (also to a re-send of the call that cancelled it),
  0 the job was not waiting or delayed (nothing
  changed), -1 the id was waiting but its key is not a job hash (another
  client's doing: the id only left the state it was in).
]]
-- @include "emitEvent"
-- @include "jobKey"

local prefix, id, reason, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local found = redis.call("LREM", KEYS[1], 0, id) + redis.call("LREM", KEYS[2], 0, id)
  + redis.call("ZREM", KEYS[3], id) + redis.call("ZREM", KEYS[4], id)
if found == 0 then
  -- A re-send of a call whose reply was lost carries the same reason and time:
  -- that cancel happened, so it answers as the first call did.
  if redis.call("ZSCORE", KEYS[5], id) == ARGV[4]
      and redis.pcall("HGET", prefix .. id, "failedReason") == reason then
    return 1
  end
  return 0
end
local jobHash = jobKey(prefix, id)  -- nil for a queue key's name, which no job has
if not jobHash or redis.call("TYPE", jobHash)["ok"] ~= "hash" then return -1 end
redis.call("HSET", jobHash, "failedReason", reason, "finishedOn", now)
redis.call("ZADD", KEYS[5], now, id)
emitEvent(prefix, "cancelled", id, "reason", reason)
return 1
