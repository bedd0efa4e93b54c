--[[
  pauseQueue: pause or resume a queue. Pausing moves every ready job from
  `wait` to `paused` (order kept) and makes new ready jobs go there; workers
  take nothing while the flag is set. Resuming moves them back and wakes the
  workers. Active jobs run on either way. Jobs of groups stay in their
  groups' lists: workers take nothing from them either while paused.

  KEYS[1] meta     HASH (field `paused`)
  KEYS[2] wait     LIST
  KEYS[3] paused   LIST
  KEYS[4] marker   ZSET
  KEYS[5] prioritized ZSET (stays put: workers skip it while the queue is paused)

  ARGV[1] paused  "1" to pause, "0" to resume

  Returns the number of ready jobs moved.
]]
local function moveAll(source, target)
  if redis.call("EXISTS", target) == 0 then
    local moved = redis.call("LLEN", source)
    if moved > 0 then redis.call("RENAME", source, target) end
    return moved
  end
  -- Target not empty (a client pushed there directly): keep FIFO order by
  -- moving oldest first onto the target's head.
  local moved = 0
  while redis.call("RPOPLPUSH", source, target) do moved = moved + 1 end
  return moved
end

if ARGV[1] == "1" then
  redis.call("HSET", KEYS[1], "paused", 1)
  return moveAll(KEYS[2], KEYS[3])
end
redis.call("HDEL", KEYS[1], "paused")
local moved = moveAll(KEYS[3], KEYS[2])
-- (jobs of groups wait in their groups' lists, paused or not: meta `groupWaiting` counts them)
if redis.call("LLEN", KEYS[2]) > 0 or redis.call("ZCARD", KEYS[5]) > 0
    or (tonumber(redis.call("HGET", KEYS[1], "groupWaiting")) or 0) > 0 then
  redis.call("ZADD", KEYS[4], 0, "0")
end
return moved
