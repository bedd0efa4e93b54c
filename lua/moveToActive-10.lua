--[[
  moveToActive: take up to N ready jobs and lock each one with the worker's
  token in the same step, so no sweep can ever see an active job whose lock
  was not yet set. Each taken id enters the lock index with the time its
  lock lapses. Due delayed jobs are promoted first. Order: prioritized
  jobs with a priority above 0, then `wait` (priority 0, FIFO), then jobs
  with a priority below 0.

  A fetch is idempotent per token: the ids it took are recorded under the
  token (KEYS[9]), and a call that finds that record is a re-send whose
  reply was lost. It takes nothing new and answers with the jobs the first
  call took that this token still owns, so no job is locked by a reply
  nobody read (it would stall and lose an attempt). The record goes when
  the token finishes a job (moveToFinished); its expiry, a day, only clears
  the records of workers that died first. It must outlast any outage the
  worker re-sends through: the jobs' locks may lapse meanwhile, but the
  sweep's hold keeps them for their owner, who can only claim them here.

  KEYS[1] wait      LIST  (taken from the right: FIFO)
  KEYS[2] active    LIST  (pushed on the left)
  KEYS[3] meta      HASH
  KEYS[4] delayed   ZSET
  KEYS[5] marker    ZSET
  KEYS[6] paused    LIST
  KEYS[7] failed    ZSET  (where an id without a job hash is sent)
  KEYS[8] prioritized ZSET (score: see pushReady)
  KEYS[9] fetch:<token> STRING, PX = a day: JSON list of the ids this token
          took
  KEYS[10] limiter  ZSET  (the rate limit's window: one member per start,
          `<token>#<id>`, scored by Redis's time of the start)

  ARGV[1] prefix             key prefix of the queue
  ARGV[2] token              worker token (also the lock value); a new one for every fetch
  ARGV[3] lock_ms            lock duration, ms
  ARGV[4] now                ms, or "" for Redis's clock (a fetch sent behind a blocking
          wait runs later than it was sent)
  ARGV[5] count              how many jobs to take at most
  ARGV[6] worker_id          recorded in the job as `wid` and appended to `wids`
          (one entry per attempt started)
  ARGV[7] metrics_minutes    minutes of per-minute metrics to keep (0 = keep no metrics); a
          job's first start counts its wait (includes/metrics.lua)
  ARGV[8] rate_max           rate limit: jobs that may start in any window of ARGV[9] ms
          (0 = no limit), across every worker of the queue
  ARGV[9] rate_window_ms     rate limit window, ms
  ARGV[10] max_active        most jobs active at once, across every worker (0 = no cap)
  ARGV[11] group_max_active  most jobs of one group active at once (0 = no cap)

  A job whose `exp` (addJob: its expiry) is before `now` is not started: it
  goes to failed with the reason "expired" (and counts as failed in the
  metrics), whether it waited, was delayed, retried or recovered.

  Flow control, decided here so it holds across any number of workers: while
  meta `limitedUntil` (set by a job that raised RateLimited) is ahead of
  Redis's clock nothing is taken; the rate limit takes no more than the
  window has room for, and records each start; the cap takes no more than
  `active` has room for. Retried and recovered jobs pass here like new ones.

  Groups (includes/groups.lua): while any group has a job ready, the groups
  and the jobs without a group take turns, one job per turn, the group whose
  turn is oldest first; a group with ARGV[11] jobs running sits out until one
  ends. Without groups the ring is empty and the order is as above.

  A flow-control key another client broke (another type, a value no script
  writes) stops only what it belongs to, and the fetch says so in `broken`: a
  group's list, that group (it keeps its turn, so it goes on once the key is
  deleted or a list again); `groups`, the jobs of groups; `group-active`
  when ARGV[11] caps groups, the jobs of groups (a count that is no whole
  number counts as 0); `limiter`, every job (a fetch looks again a window later).
  A start in `limiter` scored after Redis's clock counts until it is removed,
  but no wait the reply gives is longer than the window.

  Returns {nextDue, waitMs, broken, more, id1, fields1, id2, fields2, ...}: nextDue
  is the due time (ms) of the earliest delayed job, or false when none is
  delayed; waitMs is 0, or when flow control held jobs back, how long until it
  lets one start (ms, > 0, at most ARGV[9] for the rate limit) or -1 when the
  cap did (it frees when an active job ends); broken is a list of lines, one
  for each broken key this fetch met (the worker reports each once); more is
  0 when the fetch left no job ready (a worker then waits for the marker
  before its next fetch, rather than fetching with its next results), else 1;
  each
  fieldsN is the job hash as a flat field/value list, after the update. A
  paused queue yields no jobs.
]]
-- @include "emitEvent"
-- @include "pushReady"
-- @include "promoteDue"
-- @include "jobFields"
-- @include "lockIndex"
-- @include "metrics"
-- @include "groups"
-- @include "constants"
-- @include "dedupe"
-- @include "callInChunks"
-- @include "checkKeyTypes"

local prefix, token, lockMs = ARGV[1], ARGV[2], ARGV[3]
local now, limit, workerId = tonumber(ARGV[4]) or redisNowMs(), tonumber(ARGV[5]), ARGV[6]
local rateMax, rateMs, maxActive = tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0, tonumber(ARGV[10]) or 0
local groupMax = tonumber(ARGV[11]) or 0
if now ~= now or now == math.huge or now == -math.huge then  -- (tonumber takes "nan" and "inf")
  return redis.error_reply("ERR echomq moveToActive: now is " .. ARGV[4] .. ", not a time in ms")
end

local result = {false, 0, {}, 1}
-- The earliest delayed job: only when it is due is there anything to promote
-- (one read on most calls), and then the earliest is read again.
local first = redis.call("ZRANGE", KEYS[4], 0, 0, "WITHSCORES")
if first[2] and tonumber(first[2]) <= now then
  promoteDue(prefix, KEYS[4], KEYS[1], KEYS[6], KEYS[3], KEYS[5], KEYS[8], now, 1000)
  first = redis.call("ZRANGE", KEYS[4], 0, 0, "WITHSCORES")
end
if first[2] then result[1] = first[2] end

local record = redis.call("GET", KEYS[9])
if record then
  for _, id in ipairs(cjson.decode(record)) do
    local flat = redis.pcall("HGETALL", prefix .. id)
    if not flat["err"] then
      for i = 1, #flat, 2 do
        if flat[i] == "tok" and flat[i + 1] == token then
          result[#result + 1] = id
          result[#result + 1] = flat
        end
      end
    end
  end
  return result
end

local paused, limitedUntil = unpack(redis.call("HMGET", KEYS[3], "paused", "limitedUntil"))
if paused then
  return result
end

-- A line for the reply's `broken`, once per call.
local reported = {}
local function report(line)
  if reported[line] then return end
  reported[line] = true
  result[3][#result[3] + 1] = line
end
-- `key` holds another type than `expected` (another client's key): say so, and what it stops.
local function reportType(key, expected, stops)
  if reported[key] then return end
  reported[key] = true
  report(key .. " holds a " .. redis.call("TYPE", key)["ok"] .. ", not a " .. expected .. ": " .. stops)
end

-- Flow control: how many jobs may start now.
local startedAt = redisNowMs()
limitedUntil = tonumber(limitedUntil or "")
-- (a pause is MAX_PAUSE_MS at most: a longer one, or inf, is another client's value, not ours)
if limitedUntil and limitedUntil > startedAt and limitedUntil <= startedAt + MAX_PAUSE_MS then
  result[2] = limitedUntil - startedAt
  return result
end
if rateMax > 0 then
  if type(redis.pcall("ZREMRANGEBYSCORE", KEYS[10], "-inf", startedAt - rateMs)) ~= "number" then
    reportType(KEYS[10], "sorted set", "no job starts until it is deleted")
    result[2] = rateMs
    return result
  end
  local room = rateMax - redis.call("ZCARD", KEYS[10])
  if room <= 0 then
    local oldest = tonumber(redis.call("ZRANGE", KEYS[10], 0, 0, "WITHSCORES")[2])
    if oldest > startedAt then
      report(KEYS[10] .. " holds starts scored after Redis's clock (another client's): they count against " ..
        "the rate limit until they are removed")
    end
    result[2] = math.min(rateMs, math.max(1, oldest + rateMs - startedAt + 1))
    return result
  end
  limit = math.min(limit, room)
end
if maxActive > 0 then
  local room = maxActive - redis.call("LLEN", KEYS[2])
  if room <= 0 then
    result[2] = -1
    return result
  end
  limit = math.min(limit, room)
end

-- The next ready id, moved to `active`; nil when nothing is ready. Nothing
-- else can add to `prioritized` during this script, so once it is found
-- empty it is not looked at again.
local PRIORITY_ZERO = MAX_PRIORITY * 4294967296  -- the score of priority 0 (pushReady's priorityScore)
local locksKey, lapsesAt = prefix .. "locks", startedAt + tonumber(lockMs)
-- The taken ids enter the lock index in one ZADD at the end: it must not fail
-- after they were moved and locked, with no fetch record to give them back.
local wrongIndex = checkKeyTypes({{locksKey, "zset"}}, "no job is taken until it is deleted")
if wrongIndex then return wrongIndex end
local anyPrioritized = redis.call("EXISTS", KEYS[8]) == 1
local function takeNext()
  local best = anyPrioritized and redis.call("ZRANGE", KEYS[8], 0, 0, "WITHSCORES") or {}
  anyPrioritized = best[1] ~= nil
  if best[1] and tonumber(best[2]) < PRIORITY_ZERO then
    redis.call("ZREM", KEYS[8], best[1])
    redis.call("LPUSH", KEYS[2], best[1])
    return best[1]
  end
  local id = redis.call("LMOVE", KEYS[1], KEYS[2], "RIGHT", "LEFT")
  if id or not best[1] then return id end
  redis.call("ZREM", KEYS[8], best[1])
  redis.call("LPUSH", KEYS[2], best[1])
  return best[1]
end

-- With groups: the next ready id by the ring's turns, moved to `active`, and
-- its group (nil for a job without one); nil when nothing is ready.
local ringKey, groupActiveKey = prefix .. "groups", prefix .. "group-active"
local ringType = redis.call("TYPE", ringKey)["ok"]
local ringed = ringType == "zset"
if ringType ~= "none" and not ringed then
  reportType(ringKey, "sorted set", "no job of a group starts until it is deleted (and a sweep gives the " ..
    "groups their turns back)")
end
if ringed and not redis.call("ZSCORE", ringKey, GROUPS_PLAIN)
    and (redis.call("LLEN", KEYS[1]) > 0 or redis.call("EXISTS", KEYS[8]) == 1) then
  groupEnterRing(prefix, KEYS[3], GROUPS_PLAIN)  -- jobs without a group take their turn too
end
-- Whether `group` is at its cap (a `group-active` of another type: every group is).
local function atCap(group)
  if groupMax == 0 then return false end
  local raw = redis.pcall("HGET", groupActiveKey, group)
  if type(raw) == "table" then
    reportType(groupActiveKey, "hash", "no job of a group starts until it is deleted (and a sweep gives the " ..
      "groups their turns back)")
    return true
  end
  local count = parseCounter(raw, "")
  if not count then
    report(groupActiveKey .. " counts " .. string.sub(raw, 1, 40) .. " running for group " .. group ..
      ", not a whole number: counted as 0")
  end
  return (count or 0) >= groupMax
end
local taken = 0
-- A group whose list is broken sits out its turns: how many jobs this call had
-- taken when it last did. Met again with none taken since, nothing else can give.
local satOutAt = {}
local function takeByTurn()
  while true do
    local group = redis.call("ZRANGE", ringKey, 0, 0)[1]
    if not group then return takeNext(), nil end  -- the ring emptied during this call
    if satOutAt[group] == taken then return nil end
    local id
    if group == GROUPS_PLAIN then
      id = takeNext()
    elseif not atCap(group) then
      -- (at its cap the group leaves the ring; groupRelease brings it back)
      local listKey = prefix .. "group:" .. group
      id = redis.pcall("LMOVE", listKey, KEYS[2], "RIGHT", "LEFT")
      if type(id) == "table" then
        reportType(listKey, "list", "the jobs of group " .. group .. " wait until it is deleted or a list again")
        satOutAt[group], id = taken, nil
        redis.call("ZADD", ringKey, "XX", groupCount(KEYS[3], "groupTurn", 1), group)
      elseif id then
        groupWaitingLess(prefix, KEYS[3], group)
      end
    end
    -- A group that gave a job takes the next turn (its jobs left or not: an empty
    -- list leaves at its next turn); one that could not give one leaves the ring.
    if id then
      redis.call("ZADD", ringKey, "XX", groupCount(KEYS[3], "groupTurn", 1), group)
      return id, group ~= GROUPS_PLAIN and group or nil
    elseif satOutAt[group] ~= taken then
      redis.call("ZREM", ringKey, group)
    end
  end
end

-- Set `field` to `value` in a flat HGETALL list (appending it when absent).
local function setFlat(flat, field, value)
  for i = 1, #flat, 2 do
    if flat[i] == field then
      flat[i + 1] = value
      return
    end
  end
  flat[#flat + 1] = field
  flat[#flat + 1] = value
end

local takenIds, expiredJobs = {}, 0
while taken < limit do
  local id, group
  if ringed then id, group = takeByTurn() else id = takeNext() end
  if not id then break end
  local jobKey = prefix .. id
  local flat = redis.pcall("HGETALL", jobKey)
  if flat["err"] then
    -- A job key of another type (written by some other client): it cannot
    -- run, and an error here would strand the jobs already taken.
    redis.call("LREM", KEYS[2], 1, id)
    failKeyOfWrongType(prefix, KEYS[7], id, now)
  elseif #flat == 0 then
    -- An id with no job hash behind it (written by some other client):
    -- nothing can run it, so it is failed with a reason rather than dropped.
    redis.call("LREM", KEYS[2], 1, id)
    moveToFailed(prefix, KEYS[7], id, "job hash was missing when a worker fetched the id", now)
  else
    local ats, wids, startedOn, readyAt, due, expiresAt
    for i = 1, #flat, 2 do
      local field = flat[i]
      if field == "ats" then ats = flat[i + 1]
      elseif field == "wids" then wids = flat[i + 1]
      elseif field == "startedOn" then startedOn = flat[i + 1]
      elseif field == "timestamp" then readyAt = flat[i + 1]
      elseif field == "due" then due = flat[i + 1]
      elseif field == "exp" then expiresAt = tonumber(flat[i + 1]) end
    end
    if expiresAt and expiresAt < now then
      -- Not started by its expiry (addJob's `exp`): it never starts. (Taken by its group's turn, it held no slot.)
      redis.call("LREM", KEYS[2], 1, id)
      moveToFailed(prefix, KEYS[7], id, "expired", now)
      dedupeRelease(prefix, id)
      countMetric("failed", 1)
      expiredJobs = expiredJobs + 1
    else
      -- PXAT: the lock lapses at exactly the time the index records (every id
      -- taken enters the index in one ZADD at the end of the call).
      redis.call("SET", jobKey .. ":lock", token, "PXAT", lapsesAt)
      -- Read-and-write rather than HINCRBY: a corrupt `ats` must not abort the
      -- script halfway through its writes.
      local update = {"ats", (parseCounter(ats, "ats") or 0) + 1, "processedOn", now, "tok", token,
        "wid", workerId, "wids", appendToJsonList(wids, workerId, 1000)}
      if not startedOn then
        update[#update + 1] = "startedOn"
        update[#update + 1] = now
        readyAt = tonumber(due) or tonumber(readyAt)
        if readyAt then timeMetric("wait", now - readyAt) end
      end
      redis.call("HSET", jobKey, unpack(update))
      if group and not groupStarted(prefix, id, group) then
        reportType(prefix .. "group-running", "hash", "the jobs of groups started meanwhile hold their slots " ..
          "until a sweep after it is deleted")
      end
      for i = 1, #update, 2 do setFlat(flat, update[i], tostring(update[i + 1])) end
      emitEvent(prefix, "active", id)
      result[#result + 1] = id
      result[#result + 1] = flat
      taken = taken + 1
      takenIds[taken] = id
    end
  end
end
if expiredJobs > 0 and taken == 0 then flushMetrics(prefix, now, tonumber(ARGV[7])) end
if taken > 0 then
  local indexed = {}
  for _, id in ipairs(takenIds) do
    indexed[#indexed + 1] = lapsesAt
    indexed[#indexed + 1] = id
  end
  callInChunks("ZADD", locksKey, indexed)
  redis.call("SET", KEYS[9], cjson.encode(takenIds), "PX", 86400000)
  if rateMax > 0 then
    -- One member per attempt started: the token is new for every fetch (an id
    -- is not: a caller may add the same id again once the job is gone).
    local starts = {}
    for _, id in ipairs(takenIds) do
      starts[#starts + 1] = startedAt
      starts[#starts + 1] = token .. "#" .. id
    end
    callInChunks("ZADD", KEYS[10], starts)
    redis.call("PEXPIRE", KEYS[10], rateMs)
  end
  flushMetrics(prefix, now, tonumber(ARGV[7]))
end

-- The marker was consumed by whoever woke us; leave one behind while work
-- remains so another blocked worker wakes too. (A call that took fewer than
-- it could found nothing more ready.)
if taken == limit and (redis.call("LLEN", KEYS[1]) > 0 or redis.call("ZCARD", KEYS[8]) > 0
    or ringed and redis.call("EXISTS", ringKey) == 1) then
  redis.call("ZADD", KEYS[5], 0, "0")
else
  result[4] = 0
end
return result
