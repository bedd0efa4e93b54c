-- @include "emitEvent"
-- @include "jobFields"
-- @include "pushReady"

-- The sweep's recovery of one marked, lockless job: `atm` and `stc` go up by
-- one, set from the values read here, `tok` goes, and the job goes to failed
-- when it reached its attempt ceiling (opts.attempts, else defaultAttempts) or
-- stalled more than maxStalled times, or was cancelled while it ran (`cxl`,
-- see cancelJob: a cancelled job is never recovered). Returns what became of it:
--   "ready"        to be pushed to wait/paused by the caller (one LPUSH for all)
--   "prioritized"  already added to the prioritized set (it has a priority)
--   "grouped"      already added to its group's list (it has a group)
--   "failed"       moved to failed (also when its hash is missing or malformed, or
--                  its group's list is another client's key of another type)
-- The caller takes the id out of `active`, `stalled` and the lock index.
local function recoverJob(prefix, failedKey, metaKey, prioritizedKey, id, now, maxStalled, defaultAttempts)
  local jobKey = prefix .. id
  -- Whatever becomes of it, the job leaves `active`: its group's slot is free.
  groupRelease(prefix, metaKey, id)
  -- pcall: a job key of another type must not stop the sweep after earlier writes.
  local fields = redis.pcall("HMGET", jobKey, "atm", "stc", "opts", "pri", "cxl", "grp")
  if fields["err"] then
    failKeyOfWrongType(prefix, failedKey, id, now)
    return "failed"
  end
  if not (fields[1] or fields[2] or fields[3]) and redis.call("EXISTS", jobKey) == 0 then
    moveToFailed(prefix, failedKey, id, "job hash was missing when the sweeper recovered the id", now)
    return "failed"
  end
  local group = groupOf(fields[6])
  local attemptsMade, badAtm = parseCounter(fields[1], "atm")
  local stalls, badStc = parseCounter(fields[2], "stc")
  local maxAttempts, badOpts = parseMaxAttempts(fields[3], defaultAttempts)
  local bad = badAtm or badStc or badOpts
  if bad then
    moveToFailed(prefix, failedKey, id, "stalled, and cannot be retried: " .. bad, now)
    return "failed"
  end
  attemptsMade, stalls = attemptsMade + 1, stalls + 1
  redis.call("HSET", jobKey, "atm", attemptsMade, "stc", stalls)
  redis.call("HDEL", jobKey, "tok")
  if fields[5] then
    moveToFailed(prefix, failedKey, id, fields[5], now)
    return "failed"
  elseif attemptsMade >= maxAttempts then
    moveToFailed(prefix, failedKey, id, "job stalled and reached its attempt ceiling (" ..
      attemptsMade .. " of " .. maxAttempts .. " attempts made)", now)
    return "failed"
  elseif stalls > maxStalled then
    moveToFailed(prefix, failedKey, id, "job stalled more than max_stalled_count (" ..
      stalls .. " stalls, max_stalled_count " .. maxStalled .. ")", now)
    return "failed"
  end
  emitEvent(prefix, "recovered", id, "atm", attemptsMade)
  if group then
    return groupPush(prefix, metaKey, id, group) and "grouped" or "failed"
  end
  local priority = parsePriority(fields[4])
  if priority ~= 0 then
    redis.call("ZADD", prioritizedKey, priorityScore(metaKey, priority), id)
    return "prioritized"
  end
  return "ready"
end
