--[[
  cancelJob: cancel a job, whatever it is doing.

  A job that has not started (in wait, paused, prioritized, delayed, parked
  (docs/durable.md) or its group's list) goes
  to failed at once, with the reason, as a final failure (retryJob can still
  send it back). A running job (it has a `tok`) cannot be stopped from here:
  its hash gets the reason in `cxl`, and the worker that holds it sees the
  flag at its next lock renewal (extendLocks answers 2) and stops it. Whatever
  that attempt ends with, moveToFinished fails it for good with the reason,
  and the sweep fails a flagged job instead of recovering it. A waiting job's
  cancel sets `cxl` too, so a cancelled job is known as one wherever it is
  read; retryJob clears it. A re-send of the call (same KEYS[7]) answers
  as the first call did and changes nothing: a job flagged and since
  failed is still "running: flagged", a job cancelled and since retried is
  not cancelled again.

  KEYS[1] wait        LIST
  KEYS[2] paused      LIST
  KEYS[3] delayed     ZSET
  KEYS[4] prioritized ZSET
  KEYS[5] failed      ZSET
  KEYS[6] meta        HASH  (a group's counters: includes/groups.lua)
  KEYS[7] change:<token> HASH: each job's answer to the calls of one round trip (includes/answerOnce.lua)

  ARGV[1] prefix  key prefix of the queue
  ARGV[2] job_id
  ARGV[3] reason  recorded as the job's failedReason
  ARGV[4] now     ms
  ARGV[5] record_ms  how long KEYS[7] keeps the answers, ms
  ARGV[6] running    "leave": a running job is left to finish (Celery's revoke
                     without terminate); else it is flagged, as above

  Returns
     1 cancelled (also to a call with the same reason and time: a re-send)
     2 running: flagged, its worker will stop it (also when it already was)
     4 running, and left to finish (ARGV[6] "leave"): nothing changed
     3 already finished (completed or failed): nothing changed
     0 no such job (or an id in no state this script knows): nothing changed
    -1 the id was waiting but its key is not a job hash (another client's
       doing: the id only left the state it was in)
]]
-- @include "emitEvent"
-- @include "jobKey"
-- @include "groups"
-- @include "workflow"
-- @include "dedupe"
-- @include "answerOnce"

local prefix, id, reason, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local before = answeredBefore(KEYS[7], id)
if before then return before end

local function cancel()
  local jobHash = jobKey(prefix, id)  -- nil for a queue key's name, which no job has
  workflowKeys(prefix, KEYS[1], KEYS[2], KEYS[6], KEYS[4], KEYS[5], now)
  local found = redis.call("LREM", KEYS[1], 0, id) + redis.call("LREM", KEYS[2], 0, id)
    + redis.call("ZREM", KEYS[3], id) + redis.call("ZREM", KEYS[4], id) + redis.call("ZREM", prefix .. "deferred", id)
    + redis.call("ZREM", prefix .. "parked", id)
  local group = jobHash and groupOf(redis.pcall("HGET", jobHash, "grp"))
  if group and groupRemove(prefix, KEYS[6], id, group) then found = found + 1 end
  if found == 0 then
    if not jobHash then return 0 end
    -- pcall: a key of another type under the id is no job of ours.
    local fields = redis.pcall("HMGET", jobHash, "tok", "finishedOn", "cxl", "failedReason")
    if fields["err"] then return 0 end
    local token, finishedOn, flagged, failedReason = fields[1], fields[2], fields[3], fields[4]
    if token then
      if ARGV[6] == "leave" then return 4 end
      if not flagged then
        redis.call("HSET", jobHash, "cxl", reason)
        emitEvent(prefix, "cancelling", id, "reason", reason)
      end
      return 2
    end
    -- A call with the same reason and time (a re-send whose record lapsed, or a caller's own retry of
    -- one call) finds that cancel done: it answers as the first call did.
    if redis.call("ZSCORE", KEYS[5], id) == ARGV[4] and failedReason == reason and flagged == reason then
      return 1
    end
    if finishedOn then return 3 end
    return 0
  end
  if not jobHash or redis.call("TYPE", jobHash)["ok"] ~= "hash" then return -1 end
  -- (a workflow step cancelled while it waited keeps `deps`: retryJob refuses it, its inputs did not all come)
  redis.call("HSET", jobHash, "failedReason", reason, "finishedOn", now, "cxl", reason)
  redis.call("ZADD", KEYS[5], now, id)
  emitEvent(prefix, "cancelled", id, "reason", reason)
  workflowFailed(id, reason)
  dedupeRelease(prefix, id)
  return 1
end

return answerOnce(KEYS[7], id, cancel(), ARGV[5])
