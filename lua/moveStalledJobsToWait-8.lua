--[[
  moveStalledJobsToWait: the two-phase stalled-job sweep of one queue.

  A job in `active` whose lock key is gone is MARKED (added to `stalled`) by
  one sweep and RECOVERED only by a later sweep, if it is still marked, still
  active and still without a lock. Recovery increments `atm` and `stc` here,
  on the values this script read, takes the id out of `active` and `stalled`,
  and sends the job to wait/paused, or to failed when it reached its attempt
  ceiling (opts.attempts) or stalled more than max_stalled_count times. A
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

  KEYS[1] stalled        SET   the marks
  KEYS[2] wait           LIST
  KEYS[3] active         LIST
  KEYS[4] failed         ZSET
  KEYS[5] stalled-check  STRING with PX: the gate
  KEYS[6] meta           HASH
  KEYS[7] paused         LIST
  KEYS[8] marker         ZSET

  ARGV[1] key prefix of the queue
  ARGV[2] max_stalled_count: stalls a job may survive before it is failed
  ARGV[3] now, ms
  ARGV[4] sweep interval, ms: the gate's PX
  ARGV[5] phase: "start", or the phase the previous call returned
  ARGV[6] cursor the previous call returned (0 with "start")
  ARGV[7] how many ids of `active` this call may examine
  ARGV[8] default attempts (for jobs whose opts has no `attempts`)
  ARGV[9] "1" = forced sweep: run whatever the gate says, and close the gate
          for a whole interval from now, so that no regular sweep follows it
          within the interval and recovers what this one just marked

  Returns {phase, cursor, marked, recovered, failed, unmarked}: phase is
  "skipped" (the gate was closed: another sweep ran within the interval),
  "recover" or "mark" (call again with this phase and cursor), or "done".
  The counts are for this call only.
  Errors: "ERR echomq wrong type ..." (before any write) when a queue key
  holds the wrong Redis type.
]]
-- @include "emitEvent"
-- @include "jobFields"
-- @include "pushReady"

local stalledKey, waitKey, activeKey, failedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local gateKey, metaKey, pausedKey, markerKey = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local prefix, maxStalled, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local phase, cursor, budget = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local defaultAttempts = tonumber(ARGV[8])

-- Written over an id in `active` that this call recovers, then all removed in
-- one LREM, instead of one full-list LREM per job. No job id contains "{".
local TOMBSTONE = "{recovered}"
-- The spec fixes this script's eight keys, so the one more it may need (for a
-- recovered job that has a priority) is built from the prefix like job keys.
local prioritizedKey = prefix .. "prioritized"
local marked, recovered, failed, unmarked = 0, 0, 0, 0

if phase == "start" then
  local expected = {{activeKey, "list"}, {waitKey, "list"}, {pausedKey, "list"},
    {stalledKey, "set"}, {failedKey, "zset"}, {metaKey, "hash"}, {markerKey, "zset"},
    {prioritizedKey, "zset"}, {prefix .. "events", "stream"}}
  for _, pair in ipairs(expected) do
    local actual = redis.call("TYPE", pair[1])["ok"]
    if actual ~= "none" and actual ~= pair[2] then
      return redis.error_reply("ERR echomq wrong type: " .. pair[1] .. " holds a " .. actual ..
        ", expected a " .. pair[2] .. "; the sweep of this queue did nothing")
    end
  end
  if ARGV[9] == "1" then
    redis.call("SET", gateKey, now, "PX", ARGV[4])
  elseif not redis.call("SET", gateKey, now, "NX", "PX", ARGV[4]) then
    return {"skipped", 0, 0, 0, 0, 0}
  end
  phase, cursor = "recover", 0
end

-- Where recovered jobs go: the queue's pause state cannot change during this call.
local readyKey = waitKey
if redis.call("HEXISTS", metaKey, "paused") == 1 then readyKey = pausedKey end

-- Recover one marked, lockless job found at `index` of `active`. Returns true
-- when the job should go back to wait/paused (the caller pushes all of those
-- with one LPUSH per call); false when it went to failed or to prioritized.
local function recover(id, index)
  local jobKey = prefix .. id
  local fields = redis.call("HMGET", jobKey, "atm", "stc", "opts", "pri")
  redis.call("LSET", activeKey, index, TOMBSTONE)
  if not (fields[1] or fields[2] or fields[3]) and redis.call("EXISTS", jobKey) == 0 then
    moveToFailed(prefix, failedKey, id, "job hash was missing when the sweeper recovered the id", now)
    failed = failed + 1
    return false
  end
  local attemptsMade, badAtm = parseCounter(fields[1], "atm")
  local stalls, badStc = parseCounter(fields[2], "stc")
  local maxAttempts, badOpts = parseMaxAttempts(fields[3], defaultAttempts)
  local bad = badAtm or badStc or badOpts
  if bad then
    moveToFailed(prefix, failedKey, id, "stalled, and cannot be retried: " .. bad, now)
    failed = failed + 1
    return false
  end
  attemptsMade = redis.call("HINCRBY", jobKey, "atm", 1)
  stalls = redis.call("HINCRBY", jobKey, "stc", 1)
  redis.call("HDEL", jobKey, "tok")
  if attemptsMade >= maxAttempts then
    moveToFailed(prefix, failedKey, id, "job stalled and reached its attempt ceiling (" ..
      attemptsMade .. " of " .. maxAttempts .. " attempts made)", now)
    failed = failed + 1
    return false
  elseif stalls > maxStalled then
    moveToFailed(prefix, failedKey, id, "job stalled more than max_stalled_count (" ..
      stalls .. " stalls, max_stalled_count " .. maxStalled .. ")", now)
    failed = failed + 1
    return false
  end
  emitEvent(prefix, "recovered", id, "atm", attemptsMade)
  recovered = recovered + 1
  local priority = parsePriority(fields[4])
  if priority ~= 0 then
    redis.call("ZADD", prioritizedKey, priorityScore(metaKey, priority), id)
    return false  -- not for the batched LPUSH below
  end
  return true
end

-- Ids are looked up in groups of at most this many (Lua's unpack has a limit).
local GROUP = 1000

-- Whether each of `ids` is marked: one SMISMEMBER per group.
local function markedFlags(ids)
  local flags = {}
  for from = 1, #ids, GROUP do
    local to = math.min(from + GROUP - 1, #ids)
    for _, flag in ipairs(redis.call("SMISMEMBER", stalledKey, unpack(ids, from, to))) do
      flags[#flags + 1] = flag == 1
    end
  end
  return flags
end

-- Mark every id of ids[from..to] whose lock key is gone. One EXISTS over all
-- their lock keys settles the common cases in a single call: every lock there
-- (the steady state) or none; a mixed range is split in two and each half
-- tested again, so k lockless ids among n cost about k * log2(n / k) calls.
local function markLockless(ids, from, to)
  local lockKeys = {}
  for i = from, to do lockKeys[#lockKeys + 1] = prefix .. ids[i] .. ":lock" end
  local locked = redis.call("EXISTS", unpack(lockKeys))
  if locked == #lockKeys then return end
  if locked == 0 or from == to then
    marked = marked + redis.call("SADD", stalledKey, unpack(ids, from, to))
    return
  end
  local middle = math.floor((from + to) / 2)
  markLockless(ids, from, middle)
  markLockless(ids, middle + 1, to)
end

-- Marks left after a whole recover walk belong to ids that are not in
-- `active` (some other client moved them without unmarking). Drop a few per
-- sweep; each check is a scan of `active`, so the number is kept small.
local function dropStaleMarks()
  for _, id in ipairs(redis.call("SRANDMEMBER", stalledKey, 10)) do
    if redis.call("LPOS", activeKey, id) == false then
      redis.call("SREM", stalledKey, id)
    end
  end
end

while budget > 0 and phase ~= "done" do
  if phase == "recover" and redis.call("SCARD", stalledKey) == 0 then
    phase, cursor = "mark", 0
  end
  local length = redis.call("LLEN", activeKey)
  if cursor >= length then
    if phase == "recover" then
      dropStaleMarks()
      phase, cursor = "mark", 0
    else
      phase = "done"
    end
  else
    local count = math.min(budget, length - cursor)
    local first = length - cursor - count
    local ids = redis.call("LRANGE", activeKey, first, first + count - 1)
    budget = budget - #ids
    if phase == "recover" then
      local unmark, ready, removed, done = {}, {}, 0, {}
      local isMarked = markedFlags(ids)
      for i, id in ipairs(ids) do
        if done[id] then
          -- The same id twice in `active` (only another client can do that):
          -- the job was recovered once; its extra entry just goes.
          redis.call("LSET", activeKey, first + i - 1, TOMBSTONE)
          removed = removed + 1
        elseif isMarked[i] then
          unmark[#unmark + 1] = id
          if redis.call("EXISTS", prefix .. id .. ":lock") == 1 then
            unmarked = unmarked + 1
          else
            done[id] = true
            removed = removed + 1
            if recover(id, first + i - 1) then ready[#ready + 1] = id end
          end
        end
      end
      if #unmark > 0 then redis.call("SREM", stalledKey, unpack(unmark)) end
      if #ready > 0 then redis.call("LPUSH", readyKey, unpack(ready)) end
      if removed > 0 then redis.call("LREM", activeKey, -removed, TOMBSTONE) end
      cursor = cursor + #ids - removed
    else
      for from = 1, #ids, GROUP do
        markLockless(ids, from, math.min(from + GROUP - 1, #ids))
      end
      cursor = cursor + #ids
    end
  end
end

if recovered > 0 and readyKey == waitKey then  -- also wakes for prioritized ones
  redis.call("ZADD", markerKey, 0, "0")
end
return {phase, cursor, marked, recovered, failed, unmarked}
