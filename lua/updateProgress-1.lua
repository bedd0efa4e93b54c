--[[
  updateProgress: record the progress a running job reports, for the attempt
  that owns it only. A worker whose lock lapsed (the sweeper recovered the
  job, perhaps another worker runs it now) writes nothing: the same token
  check as moveToFinished's.

  KEYS[1] <id>  HASH  the job

  ARGV[1] prefix    key prefix of the queue
  ARGV[2] job_id
  ARGV[3] token     the attempt's lock token
  ARGV[4] progress  JSON text (a number or any JSON value)

  Returns 1 written (and a "progress" event emitted), 0 the token does not
  own the job (nothing written), -1 the job hash does not exist.
]]
-- @include "emitEvent"

local owner = redis.pcall("HGET", KEYS[1], "tok")
if type(owner) ~= "string" then
  if redis.call("EXISTS", KEYS[1]) == 0 then return -1 end
  return 0
end
if owner ~= ARGV[3] then return 0 end
redis.call("HSET", KEYS[1], "progress", ARGV[4])
emitEvent(ARGV[1], "progress", ARGV[2], "data", ARGV[4])
return 1
