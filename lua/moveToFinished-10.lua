--[[
  moveToFinished: end the current attempt of a job for the worker that owns it.
  `atm` (attempts made) grows by one. A failed attempt with attempts left is
  retried: to `delayed` after the backoff, or straight to `wait`/`paused`.
  Retention then trims the finished set the job went to.

  KEYS[1] active     LIST
  KEYS[2] completed  ZSET
  KEYS[3] failed     ZSET
  KEYS[4] delayed    ZSET
  KEYS[5] wait       LIST
  KEYS[6] paused     LIST
  KEYS[7] meta       HASH
  KEYS[8] marker     ZSET
  KEYS[9] stalled    SET
  KEYS[10] prioritized ZSET

  ARGV[1]  key prefix of the queue
  ARGV[2]  job id
  ARGV[3]  worker token
  ARGV[4]  now, ms
  ARGV[5]  outcome: "completed" or "failed"
  ARGV[6]  return value (JSON) when completed, failure reason when failed
  ARGV[7]  stack trace text of this failure ("" for none)
  ARGV[8]  default attempts (used when opts has no `attempts`)
  ARGV[9]  backoff before a retry, ms (0 = retry at once)
  ARGV[10] retention: newest jobs to keep in the finished set (-1 = all)
  ARGV[11] retention: max age of finished jobs, ms (0 = any age)
  ARGV[12] stack traces to keep per job
  ARGV[13] "1" = the failure is final: no retry whatever attempts are left
  ARGV[14] dotted path of the exception class of this failure ("" for none),
           appended to the JSON list `errc` beside the stack trace

  Returns
     1 completed
     2 failed for good (no attempts left)
     3 failed, retried: back in wait (or paused)
     4 failed, retried: in delayed until its backoff ends
     5 this token already finished the job (a replay after a lost reply)
    -1 the job hash does not exist
    -2 the token does not own the job: its lock was lost
]]
-- @include "emitEvent"
-- @include "pushReady"
-- @include "jobFields"
-- @include "applyRetention"

local prefix, id, token = ARGV[1], ARGV[2], ARGV[3]
local now, outcome = tonumber(ARGV[4]), ARGV[5]
local jobKey = prefix .. id

if redis.call("EXISTS", jobKey) == 0 then return -1 end
if redis.call("HGET", jobKey, "tok") ~= token then
  if redis.call("HGET", jobKey, "ftk") == token then return 5 end
  return -2
end

-- Validate before the first write: a script that errors halfway keeps its
-- earlier writes.
local fields = redis.call("HMGET", jobKey, "atm", "opts")
local attemptsMade, badAtm = parseCounter(fields[1], "atm")
local maxAttempts, badOpts = parseMaxAttempts(fields[2], tonumber(ARGV[8]))

redis.call("LREM", KEYS[1], -1, id)
redis.call("SREM", KEYS[9], id)
redis.call("DEL", jobKey .. ":lock")
redis.call("HDEL", jobKey, "tok")
redis.call("HSET", jobKey, "ftk", token)

if badAtm or badOpts then
  moveToFailed(prefix, KEYS[3], id, badAtm or badOpts, now)
  return 2
end

attemptsMade = attemptsMade + 1
redis.call("HSET", jobKey, "atm", attemptsMade)
local keepCount, keepAgeMs = tonumber(ARGV[10]), tonumber(ARGV[11])

if outcome == "completed" then
  redis.call("HSET", jobKey, "finishedOn", now, "returnvalue", ARGV[6])
  redis.call("ZADD", KEYS[2], now, id)
  emitEvent(prefix, "completed", id)
  applyRetention(prefix, KEYS[2], keepCount, keepAgeMs, now)
  return 1
end

redis.call("HSET", jobKey, "failedReason", ARGV[6])
if ARGV[7] ~= "" or ARGV[14] ~= "" then
  -- One entry in each list per failure, so the two stay aligned.
  local lists = redis.call("HMGET", jobKey, "stacktrace", "errc")
  local keep = tonumber(ARGV[12])
  redis.call("HSET", jobKey, "stacktrace", appendToJsonList(lists[1], ARGV[7], keep),
    "errc", appendToJsonList(lists[2], ARGV[14], keep))
end

if attemptsMade < maxAttempts and ARGV[13] ~= "1" then
  local backoffMs = tonumber(ARGV[9])
  emitEvent(prefix, "retried", id, "reason", ARGV[6])
  if backoffMs > 0 then
    redis.call("ZADD", KEYS[4], now + backoffMs, id)
    redis.call("ZADD", KEYS[8], 0, "0")
    return 4
  end
  pushReady(prefix, KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[10], id)
  return 3
end

moveToFailed(prefix, KEYS[3], id, ARGV[6], now)
applyRetention(prefix, KEYS[3], keepCount, keepAgeMs, now)
return 2
