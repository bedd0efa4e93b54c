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

  ARGV[1] key prefix of the queue
  ARGV[2] worker token (also the lock value); a new one for every fetch
  ARGV[3] lock duration, ms
  ARGV[4] now, ms
  ARGV[5] how many jobs to take at most
  ARGV[6] worker id, recorded in the job as `wid` and appended to `wids`
          (one entry per attempt started)
  ARGV[7] minutes of per-minute metrics to keep (0 = keep no metrics); a
          job's first start counts its wait (includes/metrics.lua)

  Returns {nextDue, id1, fields1, id2, fields2, ...}: nextDue is the due time
  (ms) of the earliest delayed job, or false when none is delayed; each
  fieldsN is the job hash as a flat field/value list, after the update. A
  paused queue yields no jobs.
]]
-- @include "emitEvent"
-- @include "pushReady"
-- @include "promoteDue"
-- @include "jobFields"
-- @include "lockIndex"
-- @include "metrics"

local prefix, token, lockMs = ARGV[1], ARGV[2], ARGV[3]
local now, limit, workerId = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]

promoteDue(prefix, KEYS[4], KEYS[1], KEYS[6], KEYS[3], KEYS[5], KEYS[8], now, 1000)

local result = {false}
local first = redis.call("ZRANGE", KEYS[4], 0, 0, "WITHSCORES")
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

if redis.call("HEXISTS", KEYS[3], "paused") == 1 then
  return result
end

-- The next ready id, moved to `active`; nil when nothing is ready. Nothing
-- else can add to `prioritized` during this script, so once it is found
-- empty it is not looked at again.
local PRIORITY_ZERO = 100 * 4294967296
local locksKey, lapsesAt = prefix .. "locks", redisNowMs() + tonumber(lockMs)
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

local taken, takenIds = 0, {}
while taken < limit do
  local id = takeNext()
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
    -- PXAT: the lock lapses at exactly the time the index records.
    redis.call("SET", jobKey .. ":lock", token, "PXAT", lapsesAt)
    redis.call("ZADD", locksKey, lapsesAt, id)
    local ats, wids, startedOn, readyAt, due
    for i = 1, #flat, 2 do
      local field = flat[i]
      if field == "ats" then ats = flat[i + 1]
      elseif field == "wids" then wids = flat[i + 1]
      elseif field == "startedOn" then startedOn = flat[i + 1]
      elseif field == "timestamp" then readyAt = flat[i + 1]
      elseif field == "due" then due = flat[i + 1] end
    end
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
    for i = 1, #update, 2 do setFlat(flat, update[i], tostring(update[i + 1])) end
    emitEvent(prefix, "active", id)
    result[#result + 1] = id
    result[#result + 1] = flat
    taken = taken + 1
    takenIds[taken] = id
  end
end
if taken > 0 then
  redis.call("SET", KEYS[9], cjson.encode(takenIds), "PX", 86400000)
  flushMetrics(prefix, now, tonumber(ARGV[7]))
end

-- The marker was consumed by whoever woke us; leave one behind while work
-- remains so another blocked worker wakes too.
if taken > 0 and (redis.call("LLEN", KEYS[1]) > 0 or redis.call("ZCARD", KEYS[8]) > 0) then
  redis.call("ZADD", KEYS[5], 0, "0")
end
return result
