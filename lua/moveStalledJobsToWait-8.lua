--[[
  moveStalledJobsToWait: the two-phase stalled-job sweep of one queue.

  A job in `active` whose lock key is gone is MARKED (added to `stalled`) by
  one sweep and RECOVERED only by a later sweep, if it is still marked, still
  active and still without a lock. Recovery (includes/recoverJob.lua) sets
  `atm` and `stc` one higher than the values this script read, takes the id
  out of `active` and `stalled`, and sends the job to wait/paused
  (prioritized when it has a priority), or to failed when it reached its
  attempt ceiling (opts.attempts, else ARGV[8]) or stalled more than
  max_stalled_count times. A
  marked job whose lock is back (its worker renewed) is unmarked and left
  alone.

  One sweep may span several calls of this script so that no single call
  blocks Redis for long: each call examines at most ARGV[7] ids of `active`
  and handles every job it examines completely. The caller starts with phase
  "start" and passes back the phase and cursor each call returns until the
  phase is "done". The walk goes from the tail of `active` (its oldest jobs)
  towards the head, where new jobs arrive, so arrivals never shift it. The
  recover walk runs to the end before the mark walk begins, so a job marked
  in this sweep is never recovered in this sweep. An id the walk misses
  because a worker finished a job meanwhile is simply handled next sweep.
  The recover walk is skipped when nothing is marked, and the mark walk
  reads only the ids whose lock time has passed from the lock index (see
  includes/lockIndex.lua) when the index covers `active`, so a sweep that finds nothing
  to do costs a few lookups however long `active` is. The start of each
  sweep also removes completed jobs past their result TTL (trimResults), as
  a finish does: on a queue where nothing finishes, nothing else would.

  The hold: a lapsed lock means "dead worker" only if the worker could reach
  Redis for a whole lock duration and did not renew. After Redis was
  unreachable (restarted, failed over, cut off) every lock may have lapsed
  while the workers were alive and retrying. So each call records Redis's
  time in meta `sweptAt`; a call that finds the previous one more than
  interval + half a lock duration ago (sweeps stopped for longer than a
  live worker's lock can go unrenewed: Redis was away, or no sweeper ran)
  opens a hold of one lock duration (meta
  `sweepHoldUntil`, Redis's clock), and until it ends every sweep, forced
  or not, marks and recovers nothing. Live workers renew as soon as they
  reach Redis again, which clears their marks.

  KEYS[1] stalled        SET   the marks
  KEYS[2] wait           LIST
  KEYS[3] active         LIST
  KEYS[4] failed         ZSET
  KEYS[5] stalled-check  STRING with PX: the gate
  KEYS[6] meta           HASH
  KEYS[7] paused         LIST
  KEYS[8] marker         ZSET

  ARGV[1] prefix             key prefix of the queue
  ARGV[2] max_stalled_count  stalls a job may survive before it is failed
  ARGV[3] now                ms
  ARGV[4] interval_ms        sweep interval, ms: the gate's PX
  ARGV[5] phase              "start", or the phase the previous call returned
  ARGV[6] cursor             the cursor the previous call returned (0 with "start")
  ARGV[7] budget             how many ids of `active` this call may examine
  ARGV[8] default_attempts   for jobs whose opts has no `attempts`
  ARGV[9] force              "1" = forced sweep: run whatever the gate says, and close the gate
          for a whole interval from now, so that no regular sweep follows it
          within the interval and recovers what this one just marked
  ARGV[10] lock_ms           lock duration, ms: how long the hold after a gap in sweeping lasts
  ARGV[11] metrics_minutes   minutes of per-minute metrics to keep (0 = keep no metrics): the
          sweep that passes the gate samples how many jobs are waiting, and
          every call counts the jobs it recovered and failed
          (includes/metrics.lua)

  The call that passes the gate also repairs the groups' bookkeeping where
  another client's writes left it wrong (includes/groups.lua, groupRepair):
  each group's running count is recounted from `group-running`, and a group
  with jobs waiting, none running and no turn in the ring takes a turn again.

  Returns {phase, cursor, marked, recovered, failed, unmarked, repairs}: phase is
  "skipped" (the gate was closed: another sweep ran within the interval),
  "held" (the hold above: cursor is how many ms it still lasts),
  "recover", "mark" or "lapsed" (call again with this phase and cursor), or
  "done".
  The counts are for this call only; repairs is a list of lines, one for each
  repair of the groups' bookkeeping (empty except in the call that passed the gate).
  Errors: "ERR echomq wrong type ..." (before any write) when a queue key
  holds the wrong Redis type.
]]
-- @include "checkKeyTypes"
-- @include "sweepHold"
-- @include "recoverJob"
-- @include "locklessRuns"
-- @include "metrics"
-- @include "workflow"
-- @include "dedupe"
-- @include "applyRetention"
-- @include "recoverGroup"

local stalledKey, waitKey, activeKey, failedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local gateKey, metaKey, pausedKey, markerKey = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local prefix, maxStalled, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local phase, cursor, budget = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local defaultAttempts, interval, lockMs = tonumber(ARGV[8]), tonumber(ARGV[4]), tonumber(ARGV[10])
local keepMetrics = tonumber(ARGV[11])

-- The spec fixes this script's eight keys, so the three more it uses are built
-- from the prefix, as job keys are (all share the queue's hash tag, so one
-- cluster slot): the prioritized set (for a recovered job with a priority),
-- the lock index and the event stream (emitEvent).
local prioritizedKey = prefix .. "prioritized"
local locksKey = prefix .. "locks"
workflowKeys(prefix, waitKey, pausedKey, metaKey, prioritizedKey, failedKey, now)
local marked, recovered, failed, unmarked, repairs = 0, 0, 0, 0, {}

if phase == "start" then
  local wrong = checkKeyTypes({{activeKey, "list"}, {waitKey, "list"}, {pausedKey, "list"},
    {stalledKey, "set"}, {failedKey, "zset"}, {metaKey, "hash"}, {markerKey, "zset"},
    {prioritizedKey, "zset"}, {locksKey, "zset"}, {prefix .. "events", "stream"},
    {prefix .. "groups", "zset"}, {prefix .. "group-active", "hash"}, {prefix .. "group-waiting", "zset"},
    {prefix .. "group-running", "hash"}},
    "the sweep of this queue did nothing")
  if wrong then return wrong end
end

-- The hold (see the header), decided on every call, so that a sweep that
-- spans an outage stops there too. Only the meta hash is written before it.
local redisNow, holdUntil = sweepHold(metaKey, interval, lockMs)

if phase == "start" then
  if ARGV[9] == "1" then
    redis.call("SET", gateKey, now, "PX", ARGV[4])
  elseif not redis.call("SET", gateKey, now, "NX", "PX", ARGV[4]) then
    return {"skipped", 0, 0, 0, 0, 0, repairs}
  end
  phase, cursor = "recover", 0
  -- One sample per sweep interval, whichever sweeper runs it: the depth the
  -- dashboard draws over time.
  sampleMetric("waiting", redis.call("LLEN", waitKey) + redis.call("ZCARD", prioritizedKey)
    + redis.call("LLEN", pausedKey))
  flushMetrics(prefix, now, keepMetrics)
  -- Results past their TTL, also on a queue where no later finish trims them (includes/applyRetention.lua).
  trimResults(prefix, prefix .. "completed", now)
  repairs = groupRepair(prefix, metaKey, markerKey)
end
if redisNow < holdUntil then
  return {"held", holdUntil - redisNow, 0, 0, 0, 0, repairs}
end

-- Where recovered jobs go: the queue's pause state cannot change during this call.
local readyKey = waitKey
if redis.call("HEXISTS", metaKey, "paused") == 1 then readyKey = pausedKey end

-- Recover one marked, lockless job (recoverJob); true when it is to be pushed
-- to readyKey by the caller.
local function recover(id)
  local outcome = recoverJob(prefix, failedKey, metaKey, prioritizedKey, id, now, maxStalled, defaultAttempts)
  if outcome == "failed" then
    failed = failed + 1
    workflowFailed(id)
    dedupeRelease(prefix, id)
    return false
  end
  recovered = recovered + 1
  return outcome == "ready"
end

-- Each step of a call handles at most this many ids: every list built from
-- them is unpacked into one command, and Lua's unpack has a limit.
local GROUP = 1000

-- Mark every lockless id of `ids` (at most GROUP).
local function markLockless(ids)
  if #ids == 0 then return end
  forLockless(prefix, ids, 1, #ids, function(a, b)
    marked = marked + redis.call("SADD", stalledKey, unpack(ids, a, b))
  end)
end

-- Marks left after a whole recover walk belong to ids that are not in
-- `active` (some other client moved them without unmarking). Drop a few per
-- sweep; each check is a scan of `active`, so the number is kept small.
local function dropStaleMarks()
  for _, id in ipairs(redis.call("SRANDMEMBER", stalledKey, 10)) do
    if redis.call("LPOS", activeKey, id) == false then
      redis.call("SREM", stalledKey, id)
      -- An index entry whose id left `active` behind the scripts' back goes
      -- too, so the counts differ and the next sweep walks `active`.
      redis.call("ZREM", locksKey, id)
    end
  end
end

-- How this sweep marks: from the lock index ("lapsed") when it holds as many
-- ids as `active` (every id there came through moveToActive), else by walking
-- `active` and testing every lock key ("mark"), which also finds ids that
-- another client put in `active`.
local function markPhase(length)
  if redis.call("ZCARD", locksKey) == length then return "lapsed" end
  return "mark"
end

while budget > 0 and phase ~= "done" do
  local length = redis.call("LLEN", activeKey)
  if phase == "recover" and redis.call("SCARD", stalledKey) == 0 then
    phase, cursor = markPhase(length), 0
  end
  if phase == "lapsed" then
    -- The index holds exactly the ids of `active`: only ids whose lock time
    -- has passed can be lockless, so only those are looked at. Marked ones
    -- stay in the index (scored in the past) until they are recovered.
    local asked = math.min(budget, GROUP)
    local ids = redis.call("ZRANGEBYSCORE", locksKey, "-inf", redisNowMs(), "LIMIT", cursor, asked)
    markLockless(ids)
    cursor, budget = cursor + #ids, budget - #ids
    if #ids < asked then phase = "done" end  -- fewer than asked for: that was the last of them
  elseif cursor >= length then
    if phase == "recover" then
      dropStaleMarks()
      phase, cursor = markPhase(length), 0
    else
      phase = "done"
    end
  else
    local count = math.min(budget, length - cursor, GROUP)  -- at most GROUP, whatever the budget
    local first = length - cursor - count
    local ids = redis.call("LRANGE", activeKey, first, first + count - 1)
    budget = budget - #ids
    if phase == "recover" then  -- (includes/recoverGroup.lua)
      local gone, lockBack = recoverGroup(prefix, stalledKey, activeKey, locksKey, readyKey, ids, first, length,
        recover)
      cursor, unmarked = cursor + #ids - gone, unmarked + lockBack
    else
      markLockless(ids)
      cursor = cursor + #ids
    end
  end
end

if recovered > 0 and readyKey == waitKey then  -- also wakes for prioritized ones
  redis.call("ZADD", markerKey, 0, "0")
end
if recovered > 0 then countMetric("recovered", recovered) end
if failed > 0 then countMetric("failed", failed) end
flushMetrics(prefix, now, keepMetrics)
return {phase, cursor, marked, recovered, failed, unmarked, repairs}
