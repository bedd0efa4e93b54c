-- @include "groups"
-- @include "constants"

-- Put a ready job id where workers take it from. A job with a priority (hash
-- field `pri`, MIN_PRIORITY..MAX_PRIORITY, higher runs first) goes to the
-- `prioritized` ZSET, scored so that higher priorities come first and equal
-- ones keep FIFO order; any other job goes to `wait`, or to `paused` while the
-- queue is paused. The marker wakes a worker unless the queue is paused.
-- With `front`, sequence 0: ahead of every job of that priority.
local function priorityScore(metaKey, priority, front)
  -- (MAX_PRIORITY - priority) * 2^32 + sequence: exact in a double for 2^32 jobs per queue.
  local sequence = front and 0 or groupCount(metaKey, "prioritySequence", 1) % 4294967296
  return (MAX_PRIORITY - priority) * 4294967296 + sequence
end

-- The priority in a raw `pri` field; anything but an integer from MIN_PRIORITY
-- to MAX_PRIORITY counts as 0, so a corrupt field can never make a script fail
-- halfway.
local function parsePriority(raw)
  local priority = raw and string.match(raw, "^%-?%d+$") and tonumber(raw) or 0
  if priority < MIN_PRIORITY or priority > MAX_PRIORITY then return 0 end
  return priority
end

-- A job with a group goes to its group's list (includes/groups.lua), or to
-- failed when that list is another client's key of another type.
-- With `front`, the job goes ahead of the others of its priority instead of
-- behind them (a job that gave way to a rate limit).
--
-- It never raises, as the groups' helpers never do: its callers have taken the
-- job out of where it was (delayed, active, failed) before they call it, and
-- Redis keeps a script's writes before an error, so a raise here would leave
-- the job in no state at all. A meta another client made another type counts
-- as not paused (the job waits in `wait`; no fetch takes anything until the
-- key is a hash again), a broken marker only wakes no worker, and a `wait`,
-- `paused` or `prioritized` of another type sends the job to failed with the
-- reason, as a group's list does (Retry brings it back once the key is fixed).
local function pushReady(prefix, waitKey, pausedKey, metaKey, markerKey, prioritizedKey, id, front)
  local paused = redis.pcall("HEXISTS", metaKey, "paused") == 1
  -- pcall: a job key of another type counts as priority 0 and no group here;
  -- the worker that fetches the id sends it to failed.
  local raw = redis.pcall("HMGET", prefix .. id, "pri", "grp")
  if raw["err"] then raw = {} end
  local priority, group = parsePriority(raw[1]), groupOf(raw[2])
  local push = front and "RPUSH" or "LPUSH"  -- workers take from the right
  if group then
    -- (paused or not: moveToActive takes nothing while paused)
    if not groupPush(prefix, metaKey, id, group, front) then return end
  else
    local key, kind, pushed = waitKey, "list", nil
    if priority ~= 0 then
      key, kind = prioritizedKey, "sorted set"
      pushed = redis.pcall("ZADD", key, priorityScore(metaKey, priority, front), id)
    else
      if paused then key = pausedKey end
      pushed = redis.pcall(push, key, id)
    end
    if type(pushed) ~= "number" then  -- another client's key of another type cannot take it: failed, saying why
      moveToFailed(prefix, prefix .. "failed", id, key .. " holds a " .. redis.call("TYPE", key)["ok"] ..
        ", not a " .. kind, redisNowMs())
      return
    end
  end
  if not paused then
    redis.pcall("ZADD", markerKey, 0, "0")
  end
end
