--[[
  cleanJobs: delete up to N jobs of a finished set (completed or failed) that
  finished before a cutoff, hashes and logs included. Call again until it returns 0;
  each call is bounded so that cleaning 100,000 jobs never blocks Redis long.

  KEYS[1] <state>  ZSET: completed or failed, score = time finished (ms)

  ARGV[1] prefix     key prefix of the queue
  ARGV[2] cutoff_ms  jobs finished before it go
  ARGV[3] limit      how many at most (1..1000)

  Returns the number of jobs deleted.
]]
-- @include "emitEvent"
-- @include "jobKey"

local prefix, cutoff = ARGV[1], tonumber(ARGV[2])
local doomed = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", "(" .. cutoff, "LIMIT", 0, tonumber(ARGV[3]))
for _, id in ipairs(doomed) do
  local key = jobKey(prefix, id)
  if key then redis.call("UNLINK", key, jobCompanions(prefix, id)) end  -- a stray entry named like a queue key only leaves the set
  redis.call("ZREM", KEYS[1], id)
  emitEvent(prefix, "removed", id, "by", "cleanJobs")
end
return #doomed
