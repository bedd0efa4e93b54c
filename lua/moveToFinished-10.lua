--[[
  moveToFinished: end the current attempt of one or more jobs, each for the
  worker that owns it. A worker writes every attempt that ended since its last
  round trip in one call. `atm` (attempts made) grows by one
  (a job whose `atm` or `opts` is corrupt is failed as it is). A failed attempt
  with attempts left is retried: to `delayed` after the backoff, or straight
  to `wait`/`paused`/`prioritized`. Retention then trims the finished sets the
  jobs went to. A finish also deletes its token's fetch record (see
  moveToActive): a worker that finishes with a token has read the fetch's
  reply, so that fetch will not be sent again. Each finished attempt is
  counted in the queue's metrics (includes/metrics.lua): its run time, and
  whether it completed, failed for good or will be retried. The end of a
  workflow's member (completed, or failed for good) is counted in its workflow
  in the same step (includes/workflow.lua): the next step made ready, or failed. A job cancelled
  while it ran (`cxl`, see cancelJob) fails for good with the cancel's reason,
  whatever the attempt ended with: the reason goes to `failedReason`, and the
  attempt's own error, if it had one, to the stack traces.

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

  ARGV[1] prefix                 key prefix of the queue
  ARGV[2] now                    ms
  ARGV[3] default_attempts       used when opts has no `attempts`
  ARGV[4] keep_traces            stack traces to keep per job
  ARGV[5] keep_completed_count   retention of `completed`: newest jobs to keep (-1 = all)
  ARGV[6] keep_completed_age_ms  retention of `completed`: max age, ms (0 = any age)
  ARGV[7] keep_failed_count      retention of `failed`: newest jobs to keep (-1 = all)
  ARGV[8] keep_failed_age_ms     retention of `failed`: max age, ms (0 = any age)
  ARGV[9] metrics_minutes        minutes of per-minute metrics to keep (0 = keep no metrics)
  then eight values per attempt, ARGV[n+1] to ARGV[n+8] with n = 9, 17, 25, ...:
  ARGV[n+1] job_id
  ARGV[n+2] token        worker token
  ARGV[n+3] outcome      "completed", "failed", "limited" (the job raised
      RateLimited: back to the queue, no attempt used, the queue's fetching
      paused for the backoff below), "postponed" (to delayed for the backoff,
      no attempt used, the queue goes on) or "parked" (a durable signal wait,
      docs/durable.md: to `parked` until the signal named in `value` comes or
      the deadline in `backoff_ms` passes, no attempt used; a signal that came
      meanwhile sends it straight back to wait)
  ARGV[n+4] value        return value (JSON) when completed, failure reason when failed
  ARGV[n+5] stacktrace   stack trace text of this failure ("" for none)
  ARGV[n+6] backoff_ms   backoff before a retry, ms (0 = retry at once); for "limited", the pause;
      for "parked", the wait's deadline (ms since the epoch, 0 = none)
  ARGV[n+7] final        "1" = the failure is final: no retry whatever attempts are left
  ARGV[n+8] error_class  dotted path of the exception class of this failure ("" for none),
      appended to the JSON list `errc` beside the stack trace

  Returns one code per attempt, in order:
     1 completed
     2 failed for good (no attempts left, a final failure, or a corrupt `atm`/`opts`)
     3 failed, retried: back in wait (or paused, or prioritized)
     4 failed, retried: in delayed until its backoff ends
     5 this token already finished the job (a replay after a lost reply)
     6 rate limited: back in wait (or paused, or prioritized), ahead of the
       others, `atm` unchanged; meta `limitedUntil` = Redis's now + the pause
     7 postponed: in delayed until the backoff ends, `atm` unchanged
     8 parked: in `parked` until its signal or deadline, `atm` unchanged
     9 parked, but its signal came meanwhile (or its deadline passed): back in
       wait (or paused, or prioritized), `atm` unchanged
    -1 the job hash does not exist
    -2 the token does not own the job: its lock was lost
    -3 the job's key holds another type than a hash: nothing was changed
]]
-- @include "emitEvent"
-- @include "lockIndex"
-- @include "pushReady"
-- @include "jobFields"
-- @include "applyRetention"
-- @include "metrics"
-- @include "constants"
-- @include "workflow"
-- @include "dedupe"
-- @include "callInChunks"
-- @include "setAside"

local activeKey, completedKey, failedKey, delayedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local waitKey, pausedKey, metaKey, markerKey = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local stalledKey, prioritizedKey = KEYS[9], KEYS[10]
local prefix, now = ARGV[1], tonumber(ARGV[2])
local defaultAttempts, keepTraces = tonumber(ARGV[3]), tonumber(ARGV[4])
local completedTo, failedTo = false, false  -- whether retention has work to do
local locksKey = prefix .. "locks"  -- the lock index (see includes/lockIndex.lua)
local recordGone = {}  -- the tokens whose fetch record this call deletes
-- What the jobs taken out of `active` leave behind, removed at the call's end in
-- one command each (callInChunks), not one per job: their ids in the lock index
-- and `stalled`, and their lock keys with the fetch records.
local released, keysGone = {}, {}
local function removeReleased()
  callInChunks("ZREM", locksKey, released)
  callInChunks("SREM", stalledKey, released)
  callInChunks("DEL", nil, keysGone)
  released, keysGone = {}, {}
end

-- A workflow member's end, counted in its workflow (includes/workflow.lua).
-- Its targets' keys may be another client's, of another type, and the
-- delivery is the one step here that writes them: what the jobs ended so far
-- left behind is removed first, so an error there cannot leave it for good.
local function memberEnded(id, passed, value, nxt, af)
  if not nxt then return end
  removeReleased()
  workflowEnded(id, passed, value, nxt, af)
end
workflowKeys(prefix, waitKey, pausedKey, metaKey, prioritizedKey, failedKey, now)

local function finishOne(id, token, outcome, value, stacktrace, backoffMs, final, errorClass)
  local jobKey = prefix .. id
  -- pcall: one job key of the wrong type must not abort the others' finishes.
  local fields = redis.pcall("HMGET", jobKey, "tok", "ftk", "atm", "opts", "processedOn", "cxl", "nxt",
    "af", "ddk", "ddm")
  if fields["err"] then return -3 end
  if fields[1] ~= token then
    if fields[2] == token then return 5 end
    if not (fields[1] or fields[2] or fields[3] or fields[4]) and redis.call("EXISTS", jobKey) == 0 then
      return -1
    end
    return -2
  end

  -- Validate before the first write: a script that errors halfway keeps its
  -- earlier writes.
  local attemptsMade, badAtm = parseCounter(fields[3], "atm")
  local maxAttempts, badOpts, resultTtl = parseMaxAttempts(fields[4], defaultAttempts)

  if not recordGone[token] then  -- a fetch's jobs end in one call: its record is deleted once
    keysGone[#keysGone + 1] = prefix .. "fetch:" .. token  -- keys.py's fetch_record(token)
    recordGone[token] = true
  end
  redis.call("LREM", activeKey, -1, id)
  released[#released + 1] = id
  keysGone[#keysGone + 1] = jobKey .. ":lock"
  redis.call("HDEL", jobKey, "tok")
  groupRelease(prefix, metaKey, id)
  local startedAt = tonumber(fields[5])
  if startedAt then timeMetric("run", now - startedAt) end

  if badAtm or badOpts then
    redis.call("HSET", jobKey, "ftk", token)
    moveToFailed(prefix, failedKey, id, badAtm or badOpts, now)
    countMetric("failed", 1)
    failedTo = true
    memberEnded(id, false, badAtm or badOpts, fields[7], fields[8])
    dedupeRelease(prefix, id, fields[9], fields[10])
    return 2
  end

  local aside = outcome == "limited" or outcome == "postponed" or outcome == "parked"
  if aside and not fields[6] then  -- no attempt used (a cancel wins: below)
    redis.call("HSET", jobKey, "ftk", token)
    return setAside(prefix, delayedKey, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, outcome, value,
      backoffMs, now)
  end

  attemptsMade = attemptsMade + 1
  if fields[6] then  -- cancelled while it ran: whatever the attempt did, it ends here
    if outcome == "completed" then stacktrace, errorClass = "", "" end
    outcome, value, final = "failed", fields[6], "1"
  end
  if outcome == "completed" then
    redis.call("HSET", jobKey, "ftk", token, "atm", attemptsMade, "finishedOn", now, "returnvalue", value)
    redis.call("ZADD", completedKey, now, id)
    if resultTtl then  -- kept that long at most: trimResults removes it (retention may sooner)
      redis.call("HSET", jobKey, "rexp", now + resultTtl)
      redis.call("ZADD", prefix .. "result-ttl", now + resultTtl, id)
    end
    emitEvent(prefix, "completed", id)
    countMetric("completed", 1)
    completedTo = true
    memberEnded(id, true, value, fields[7], fields[8])
    dedupeRelease(prefix, id, fields[9], fields[10])
    return 1
  end

  local update = {"ftk", token, "atm", attemptsMade, "failedReason", value}
  if stacktrace ~= "" or errorClass ~= "" then
    -- One entry in each list per failure, so the two stay aligned.
    local lists = redis.call("HMGET", jobKey, "stacktrace", "errc")
    update[#update + 1] = "stacktrace"
    update[#update + 1] = appendToJsonList(lists[1], stacktrace, keepTraces)
    update[#update + 1] = "errc"
    update[#update + 1] = appendToJsonList(lists[2], errorClass, keepTraces)
  end
  redis.call("HSET", jobKey, unpack(update))

  if attemptsMade < maxAttempts and final ~= "1" then
    emitEvent(prefix, "retried", id, "reason", value)
    countMetric("retried", 1)
    if backoffMs > 0 then
      redis.call("ZADD", delayedKey, now + backoffMs, id)
      redis.call("ZADD", markerKey, 0, "0")
      return 4
    end
    pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id)
    return 3
  end

  moveToFailed(prefix, failedKey, id, value, now)
  countMetric("failed", 1)
  failedTo = true
  memberEnded(id, false, value, fields[7], fields[8])
  dedupeRelease(prefix, id, fields[9], fields[10])
  return 2
end

local codes = {}
for i = 10, #ARGV, 8 do
  codes[#codes + 1] = finishOne(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
    tonumber(ARGV[i + 5]), ARGV[i + 6], ARGV[i + 7])
end
removeReleased()
if completedTo then
  applyRetention(prefix, completedKey, tonumber(ARGV[5]), tonumber(ARGV[6]), now)
  trimResults(prefix, completedKey, now)
end
if failedTo then
  applyRetention(prefix, failedKey, tonumber(ARGV[7]), tonumber(ARGV[8]), now)
end
flushMetrics(prefix, now, tonumber(ARGV[9]))
return codes
