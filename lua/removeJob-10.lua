--[[
  removeJob: delete a job and take its id out of every state. A job that a
  live worker holds (active, lock present) is refused: removing it would let
  that worker's result land nowhere.

  KEYS[1] wait       LIST
  KEYS[2] paused     LIST
  KEYS[3] active     LIST
  KEYS[4] delayed    ZSET
  KEYS[5] completed  ZSET
  KEYS[6] failed     ZSET
  KEYS[7] stalled    SET
  KEYS[8] prioritized ZSET
  KEYS[9] meta       HASH  (a group's counters: includes/groups.lua)
  KEYS[10] change:<token> HASH: each job's answer to the calls of one round trip (includes/answerOnce.lua)

  ARGV[1] prefix     key prefix of the queue
  ARGV[2] job_id
  ARGV[3] only_from  "" to remove the job from whatever state it is in, or the index
          (4, 5 or 6) of the finished set it must still be in: the admin
          deletes a failed job only while it is failed
  ARGV[4] record_ms  how long KEYS[10] keeps the answers, ms

  Returns 1 removed, 0 no such job, -3 the job is locked by a live worker,
  -4 the job is not in the required set (nothing was changed). A re-send of
  the call (same KEYS[10]) answers as the first call did and changes nothing.
]]
-- @include "emitEvent"
-- @include "groups"
-- @include "workflow"
-- @include "dedupe"
-- @include "answerOnce"
-- @include "jobKey"

local prefix, id = ARGV[1], ARGV[2]
local before = answeredBefore(KEYS[10], id)
if before then return before end

local function remove()
  local jobKey = prefix .. id
  if ARGV[3] ~= "" and not redis.call("ZSCORE", KEYS[tonumber(ARGV[3])], id) then
    return -4
  end
  if redis.call("EXISTS", jobKey .. ":lock") == 1 then
    return -3
  end
  local group = groupOf(redis.pcall("HGET", jobKey, "grp"))
  -- A workflow's member removed before it ended: its workflow hears of it as of a failure.
  local links = redis.pcall("HMGET", jobKey, "nxt", "af", "finishedOn", "ddk", "ddm")
  if links["err"] then links = {} end
  dedupeRelease(prefix, id, links[4], links[5])  -- (before the hash goes: its key names the job)
  if links[3] then links = {} end
  local found = redis.call("UNLINK", jobKey)
  redis.call("UNLINK", jobCompanions(prefix, id))  -- freed off the script's thread: a job may hold 10,000 steps
  local wasActive = redis.call("LREM", KEYS[3], 0, id)
  for i = 1, 2 do found = found + redis.call("LREM", KEYS[i], 0, id) end
  found = found + wasActive
  if group then
    -- Its group counts it: waiting in the group's list, or running (active, its lock lapsed).
    if groupRemove(prefix, KEYS[9], id, group) then found = found + 1 end
  end
  if wasActive > 0 then groupRelease(prefix, KEYS[9], id) end
  for _, i in ipairs({4, 5, 6, 8}) do found = found + redis.call("ZREM", KEYS[i], id) end
  found = found + redis.call("SREM", KEYS[7], id) + redis.call("ZREM", prefix .. "deferred", id)
    + redis.call("ZREM", prefix .. "parked", id)
  redis.call("ZREM", prefix .. "locks", id)  -- the lock index, built from the prefix
  if found == 0 then
    return 0
  end
  emitEvent(prefix, "removed", id)
  workflowKeys(prefix, KEYS[1], KEYS[2], KEYS[9], KEYS[8], KEYS[6], tonumber(redis.call("TIME")[1]) * 1000)
  workflowEnded(id, false, "removed", links[1], links[2])
  return 1
end

return answerOnce(KEYS[10], id, remove(), ARGV[4])
