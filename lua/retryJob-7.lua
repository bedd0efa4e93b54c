--[[
  retryJob: send a failed job back to wait (or paused) for another attempt.
  Only a job that is still in `failed` moves; a cancelled one is no longer
  cancelled (`cxl` goes); a job with a dedupe key takes it back unless another
  job holds it. `atm` is kept (it never
  decreases), so a job already at its attempt ceiling gets exactly one more
  attempt.

  KEYS[1] failed   ZSET
  KEYS[2] wait     LIST
  KEYS[3] paused   LIST
  KEYS[4] meta     HASH
  KEYS[5] marker   ZSET
  KEYS[6] prioritized ZSET
  KEYS[7] change:<token> HASH: each job's answer to the calls of one round trip (includes/answerOnce.lua)

  ARGV[1] prefix  key prefix of the queue
  ARGV[2] job_id
  ARGV[3] record_ms  how long KEYS[7] keeps the answers, ms

  Returns 1 when the job was moved, 0 when it is not in `failed`, -1 when its
  key holds no job hash or the id is a queue key's name (nothing could run it;
  it stays in `failed`), -2 when it is a workflow's step that failed before
  its inputs all came (`deps` is set: run now, it would get part of them; it
  stays in `failed`). A re-send of the call (same KEYS[7]) answers as the
  first call did and changes nothing.
]]
-- @include "emitEvent"
-- @include "pushReady"
-- @include "jobKey"
-- @include "answerOnce"

local prefix, id = ARGV[1], ARGV[2]
local before = answeredBefore(KEYS[7], id)
if before then return before end

local function retry()
  if not redis.call("ZSCORE", KEYS[1], id) then
    return 0
  end
  local key = jobKey(prefix, id)
  if not key or redis.call("TYPE", key)["ok"] ~= "hash" then
    return -1  -- no job hash to run (missing, another type, a queue key's name): it stays failed
  end
  if redis.call("HEXISTS", key, "deps") == 1 then
    return -2
  end
  redis.call("ZREM", KEYS[1], id)
  redis.call("HDEL", key, "finishedOn", "failedReason", "processedOn", "cxl")
  -- Live again: it takes its dedupe key back, unless another job has taken it meanwhile.
  local dedupe = redis.call("HMGET", key, "ddk", "ddm")
  if dedupe[1] and dedupe[2] ~= "ttl" then redis.call("SET", prefix .. "dedupe:" .. dedupe[1], id, "NX") end
  emitEvent(prefix, "retried", id, "by", "retryJob")  -- (before a "failed" that pushReady may emit)
  pushReady(prefix, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], id)
  return 1
end

return answerOnce(KEYS[7], id, retry(), ARGV[3])
