--[[
  promoteDelayed: move delayed jobs whose due time has come to wait (or paused).
  Workers do this as part of moveToActive; this script lets a producer or an
  operator do it on demand.

  KEYS[1] delayed  ZSET
  KEYS[2] wait     LIST
  KEYS[3] paused   LIST
  KEYS[4] meta     HASH
  KEYS[5] marker   ZSET
  KEYS[6] prioritized ZSET

  ARGV[1] prefix  key prefix of the queue
  ARGV[2] now     ms
  ARGV[3] limit   how many at most
  ARGV[4] job_id  "" (or left out) for every due job, else one job id: promote
          this job now, due or not, if it is still delayed; nothing else
          moves. Its `due` becomes now (ARGV[2]), so its wait counts from the
          promotion; a re-send of that call (its reply lost) finds it and
          answers 1 again

  Returns the number of jobs promoted.
]]
-- @include "emitEvent"
-- @include "pushReady"
-- @include "promoteDue"

local prefix, id = ARGV[1], ARGV[4]
if id and id ~= "" then
  if redis.call("ZREM", KEYS[1], id) == 0 then
    -- A re-send of a call whose reply was lost finds the `due` it wrote: answer as it did.
    if redis.pcall("HGET", prefix .. id, "due") == ARGV[2] then return 1 end
    return 0
  end
  -- Only on a job hash: HSET would make one of a missing key (the fetch fails such an id).
  if redis.call("TYPE", prefix .. id)["ok"] == "hash" then redis.call("HSET", prefix .. id, "due", ARGV[2]) end
  emitEvent(prefix, "promoted", id)  -- (before a "failed" that pushReady may emit)
  pushReady(prefix, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], id)
  return 1
end
return promoteDue(prefix, KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
  tonumber(ARGV[2]), tonumber(ARGV[3]))
