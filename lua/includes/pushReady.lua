-- Put a ready job id where workers take it from. A job with a priority (hash
-- field `pri`, -100..100, higher runs first) goes to the `prioritized` ZSET,
-- scored so that higher priorities come first and equal ones keep FIFO order;
-- any other job goes to `wait`, or to `paused` while the queue is paused. The
-- marker wakes a worker unless the queue is paused.
local function priorityScore(metaKey, priority)
  -- (100 - priority) * 2^32 + sequence: exact in a double for 2^32 jobs per queue.
  local sequence = redis.call("HINCRBY", metaKey, "prioritySequence", 1) % 4294967296
  return (100 - priority) * 4294967296 + sequence
end

-- The priority in a raw `pri` field; anything but an integer -100..100 counts
-- as 0, so a corrupt field can never make a script fail halfway.
local function parsePriority(raw)
  local priority = raw and string.match(raw, "^%-?%d+$") and tonumber(raw) or 0
  if priority < -100 or priority > 100 then return 0 end
  return priority
end

local function pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id)
  local paused = redis.call("HEXISTS", metaKey, "paused") == 1
  -- pcall: a job key of another type counts as priority 0 here; the worker
  -- that fetches the id sends it to failed.
  local raw = redis.pcall("HGET", prefix .. id, "pri")
  local priority = parsePriority(type(raw) == "string" and raw or nil)
  if priority ~= 0 then
    redis.call("ZADD", prioritizedKey, priorityScore(metaKey, priority), id)
  elseif paused then
    redis.call("LPUSH", pausedKey, id)
  else
    redis.call("LPUSH", waitKey, id)
  end
  if not paused then
    redis.call("ZADD", markerKey, 0, "0")
  end
end
