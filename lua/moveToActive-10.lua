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

  Flow control (includes/flowGate.lua), decided here so it holds across any
  number of workers: while meta `limitedUntil` (set by a job that raised
  RateLimited) is ahead of Redis's clock nothing is taken; the rate limit
  takes no more than the window has room for, and records each start; the
  cap takes no more than `active` has room for. Retried and recovered jobs
  pass here like new ones.

  Groups (includes/groupRing.lua, on the ring of includes/groups.lua): while
  any group has a job ready, the groups and the jobs without a group take
  turns, one job per turn, the group whose turn is oldest first; a group with
  ARGV[11] jobs running sits out until one ends. Without groups the ring is
  empty and the order is as above.

  A flow-control key another client broke (another type, a value no script
  writes) stops only what it belongs to, and the fetch says so in `broken`: a
  group's list, that group (it keeps its turn, so it goes on once the key is
  deleted or a list again); `groups`, the jobs of groups; `group-active`
  when ARGV[11] caps groups, the jobs of groups (a count that is no whole
  number counts as 0); `limiter`, every job (a fetch looks again a window later).
  A start in `limiter` scored after Redis's clock counts until it is removed,
  but no wait the reply gives is longer than the window.

  Returns {nextDue, waitMs, broken, more, id1, fields1, id2, fields2, ...}: nextDue
  is the due time (ms) of the earliest delayed job or parked job's deadline
  (meta `parkedNext`, includes/parked.lua), or false when there is none;
  waitMs is 0, or when flow control held jobs back, how long until it
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
-- @include "brokenKeys"
-- @include "flowGate"
-- @include "groupRing"
-- @include "startJob"
-- @include "parked"

local waitKey, activeKey, metaKey, delayedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local markerKey, pausedKey, failedKey, prioritizedKey = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local fetchKey, limiterKey = KEYS[9], KEYS[10]
local prefix, token, lockMs = ARGV[1], ARGV[2], ARGV[3]
local now, limit, workerId = tonumber(ARGV[4]) or redisNowMs(), tonumber(ARGV[5]), ARGV[6]
local rateMax, rateMs, maxActive = tonumber(ARGV[8]) or 0, tonumber(ARGV[9]) or 0, tonumber(ARGV[10]) or 0
local groupMax = tonumber(ARGV[11]) or 0
if now ~= now or now == math.huge or now == -math.huge then  -- (tonumber takes "nan" and "inf")
  return redis.error_reply("ERR echomq moveToActive: now is " .. ARGV[4] .. ", not a time in ms")
end

local result = {false, 0, brokenLines, 1}  -- (brokenLines: the broken keys met, includes/brokenKeys.lua)
-- The earliest delayed job: only when it is due is there anything to promote
-- (one read on most calls), and then the earliest is read again.
local first = redis.call("ZRANGE", delayedKey, 0, 0, "WITHSCORES")
if first[2] and tonumber(first[2]) <= now then
  promoteDue(prefix, delayedKey, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, now, 1000)
  first = redis.call("ZRANGE", delayedKey, 0, 0, "WITHSCORES")
end
if first[2] then result[1] = first[2] end

local record = redis.call("GET", fetchKey)
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

local paused, limitedUntil, parkedNext = unpack(redis.call("HMGET", metaKey, "paused", "limitedUntil",
  "parkedNext"))
if parkedNext and not finiteMs(parkedNext) then parkedNext = now end  -- broken: recomputed below
parkedNext = finiteMs(tostring(parkedNext))
if parkedNext and parkedNext <= now then  -- a durable signal wait timed out (includes/parked.lua)
  parkedNext = promoteParked(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, now, 1000)
end
if parkedNext and (not result[1] or parkedNext < tonumber(result[1])) then result[1] = parkedNext end
if paused then
  return result
end

-- Flow control (includes/flowGate.lua): how many jobs may start now.
local startedAt, heldMs = redisNowMs(), nil
limit, heldMs = flowGate(limiterKey, activeKey, limitedUntil, startedAt, limit, rateMax, rateMs, maxActive)
if heldMs then
  result[2] = heldMs
  return result
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
local anyPrioritized = redis.call("EXISTS", prioritizedKey) == 1
local function takeNext()
  local best = anyPrioritized and redis.call("ZRANGE", prioritizedKey, 0, 0, "WITHSCORES") or {}
  anyPrioritized = best[1] ~= nil
  if best[1] and tonumber(best[2]) < PRIORITY_ZERO then
    redis.call("ZREM", prioritizedKey, best[1])
    redis.call("LPUSH", activeKey, best[1])
    return best[1]
  end
  local id = redis.call("LMOVE", waitKey, activeKey, "RIGHT", "LEFT")
  if id or not best[1] then return id end
  redis.call("ZREM", prioritizedKey, best[1])
  redis.call("LPUSH", activeKey, best[1])
  return best[1]
end

-- Groups take turns with the jobs without one (includes/groupRing.lua); nil: no ring in use.
local ringKey = prefix .. "groups"
local takeByTurn = groupRing(prefix, ringKey, metaKey, waitKey, activeKey, prioritizedKey, groupMax, takeNext)

local taken, takenIds, expiredJobs = 0, {}, 0
while taken < limit do
  local id, group
  if takeByTurn then id, group = takeByTurn(taken) else id = takeNext() end
  if not id then break end
  local flat, expired = startJob(prefix, activeKey, failedKey, id, group, token, workerId, now, lapsesAt)
  if flat then
    result[#result + 1] = id
    result[#result + 1] = flat
    taken = taken + 1
    takenIds[taken] = id
  elseif expired then
    expiredJobs = expiredJobs + 1
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
  redis.call("SET", fetchKey, cjson.encode(takenIds), "PX", 86400000)
  flowGateStarted(limiterKey, token, takenIds, startedAt, rateMax, rateMs)
  flushMetrics(prefix, now, tonumber(ARGV[7]))
end

-- The marker was consumed by whoever woke us; leave one behind while work
-- remains so another blocked worker wakes too. (A call that took fewer than
-- it could found nothing more ready.)
if taken == limit and (redis.call("LLEN", waitKey) > 0 or redis.call("ZCARD", prioritizedKey) > 0
    or takeByTurn and redis.call("EXISTS", ringKey) == 1) then
  redis.call("ZADD", markerKey, 0, "0")
else
  result[4] = 0
end
return result
