-- @include "constants"

-- The queue's metrics, written by the scripts that see each event, so every
-- worker and sweeper on every host counts without a round trip of its own.
-- A script adds up what its call saw (countMetric, timeMetric, sampleMetric)
-- and writes it once at the end (flushMetrics): two commands on one small
-- hash per call, however many jobs the call handled.
--
-- <prefix>metrics:<minute>  HASH, minute = floor(ms / MINUTE_MS); it expires
--   keepMinutes + 1 minutes after the write that creates it (Redis's clock,
--   so a worker whose clock is off cannot make a key outlive that), so a
--   queue keeps about keepMinutes of them (none while it is idle). Fields:
--     completed, failed, retried, recovered   jobs (failed: for good;
--       retried: a failed attempt that will run again; recovered: by a sweep)
--     wait_count, wait_sum, wait_max   first starts, and ms from enqueue (or
--       the end of the job's delay) to that start
--     run_count, run_sum, run_max      attempts a worker finished, and their ms
--     waiting                          jobs ready but not taken (wait,
--       prioritized, paused) when a sweep last looked in that minute
-- <prefix>metrics:total  HASH, never expires: all-time completed, failed,
--   retried, recovered.
local metricAdds, metricMaxes, metricSamples = {}, {}, {}
local TOTAL_FIELDS = {completed = true, failed = true, retried = true, recovered = true}

local function countMetric(field, n)
  metricAdds[field] = (metricAdds[field] or 0) + n
end

-- One duration (ms) of `kind` ("wait" or "run"); a negative one (clocks of
-- two hosts apart) counts as 0. The longest counted is MAX_DELAY_MS (constants),
-- ten years: a longer one, or nan or inf, comes from a time field another
-- client wrote, not a clock.
local function timeMetric(kind, ms)
  if ms ~= ms or ms > MAX_DELAY_MS then return end
  if ms < 0 then ms = 0 end
  countMetric(kind .. "_count", 1)
  countMetric(kind .. "_sum", ms)
  local field = kind .. "_max"
  if not metricMaxes[field] or ms > metricMaxes[field] then metricMaxes[field] = ms end
end

-- A stored number, or 0 when another client made it unreadable (Lua's
-- tonumber also takes "nan" and "inf", which would stick).
local function storedNumber(raw)
  local value = tonumber(raw)
  if not value or value ~= value or value == math.huge or value == -math.huge then return 0 end
  return value
end

local function sampleMetric(field, value)
  metricSamples[field] = value
end

-- Write what this call counted since the last flush into the minute of
-- `nowMs`; keepMinutes <= 0 keeps no metrics at all. No more than
-- MAX_METRICS_MINUTES (constants: a year) are kept, whatever a caller asks:
-- EXPIRE takes no more than that safely.
local function flushMetrics(prefix, nowMs, keepMinutes)
  local adds, maxes, samples = metricAdds, metricMaxes, metricSamples
  metricAdds, metricMaxes, metricSamples = {}, {}, {}
  if keepMinutes <= 0 then return end
  local read = {}
  for field in pairs(adds) do read[#read + 1] = field end
  for field in pairs(maxes) do read[#read + 1] = field end
  local written = {}
  for field, value in pairs(samples) do
    written[#written + 1] = field
    written[#written + 1] = value
  end
  if #read + #written == 0 then return end
  local minute = math.floor(nowMs / MINUTE_MS)
  local metricsKey = prefix .. "metrics:" .. minute
  if #read > 0 then
    -- pcall: a metrics key another client overwrote must not fail the call.
    local before = redis.pcall("HMGET", metricsKey, unpack(read))
    if before["err"] then before = {} end
    for i, field in ipairs(read) do
      -- A field another client made unreadable starts again from 0.
      local old = storedNumber(before[i])
      local value = adds[field] and old + adds[field] or math.max(old, maxes[field])
      written[#written + 1] = field
      written[#written + 1] = value
    end
  end
  local created = redis.pcall("HSET", metricsKey, unpack(written))
  if type(created) == "number" and created > 0 then
    redis.call("EXPIRE", metricsKey, (math.min(keepMinutes, MAX_METRICS_MINUTES) + 1) * 60)
  end
  for field, n in pairs(adds) do
    if TOTAL_FIELDS[field] then
      local metricsTotalKey = prefix .. "metrics:total"
      if type(redis.pcall("HINCRBY", metricsTotalKey, field, n)) ~= "number" then
        -- Not an integer any more (another client's write): it starts again
        -- from this call's count. A key of another type is left alone.
        redis.pcall("HSET", metricsTotalKey, field, n)
      end
    end
  end
end
