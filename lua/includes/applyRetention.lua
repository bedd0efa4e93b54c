-- @include "jobKey"
-- @include "callInChunks"

-- Trim a finished set (completed or failed) to keepCount newest jobs and drop
-- jobs older than keepAgeMs, deleting their hashes and what lives with them
-- (jobCompanions). keepCount < 0 keeps any
-- number; keepAgeMs <= 0 keeps any age. Each call removes at most 1000 jobs so
-- one finish can never block Redis for long; later finishes remove the rest.
-- The jobs leave the set in one ZREM (by age) and one ZPOPMIN (the oldest
-- over the count), and their keys go in one UNLINK, however many there are.
local function applyRetention(prefix, setKey, keepCount, keepAgeMs, now)
  local doomed = {}
  if keepAgeMs > 0 then
    doomed = redis.call("ZRANGEBYSCORE", setKey, "-inf", now - keepAgeMs, "LIMIT", 0, 1000)
    if #doomed > 0 then redis.call("ZREM", setKey, unpack(doomed)) end
  end
  if keepCount >= 0 and #doomed < 1000 then
    local excess = redis.call("ZCARD", setKey) - keepCount
    if excess > 0 then
      local popped = redis.call("ZPOPMIN", setKey, math.min(excess, 1000 - #doomed))
      for i = 1, #popped, 2 do doomed[#doomed + 1] = popped[i] end
    end
  end
  local keys = {}
  for _, id in ipairs(doomed) do
    local key = jobKey(prefix, id)
    if key then
      keys[#keys + 1] = key
      for _, companion in ipairs({jobCompanions(prefix, id)}) do keys[#keys + 1] = companion end
    end
  end
  callInChunks("UNLINK", nil, keys)  -- UNLINK: a job of 10,000 steps is freed off the script's thread
  return #doomed
end

-- Remove up to 100 completed jobs whose result TTL (opts.resultTtl) has passed:
-- `result-ttl` scores each by when. Only the completion that entered it is
-- removed: the hash's `rexp` must still be that time (a caller's id may have
-- been removed and added again since), else only the entry goes.
local function trimResults(prefix, completedKey, now)
  local ttlKey = prefix .. "result-ttl"
  local due = redis.call("ZRANGEBYSCORE", ttlKey, "-inf", now, "WITHSCORES", "LIMIT", 0, 100)
  for i = 1, #due, 2 do
    local id, at = due[i], due[i + 1]
    local key = jobKey(prefix, id)
    if key and redis.pcall("HGET", key, "rexp") == at and redis.call("ZSCORE", completedKey, id) then
      redis.call("UNLINK", key, jobCompanions(prefix, id))
      redis.call("ZREM", completedKey, id)
    end
    redis.call("ZREM", ttlKey, id)
  end
end

