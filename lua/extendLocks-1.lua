--[[
  extendLocks: renew every lock a worker holds in one call, move each one's
  time in the lock index, and clear each job's stalled mark (a live worker
  proves the job has not stalled). A worker calls this at half its lock
  duration.

  Ownership is the job's `tok` field, which moveToActive sets and every move
  out of `active` clears. If the lock key lapsed (the worker was paused) but
  the job was not recovered meanwhile, `tok` still matches and the lock is
  taken back: that is the grace the two-phase sweep gives a paused worker.

  KEYS[1] stalled   SET

  ARGV[1] prefix   key prefix of the queue
  ARGV[2] lock_ms  lock duration, ms
  then two values per held job, ARGV[n+1] to ARGV[n+2] with n = 2, 4, 6, ...:
  ARGV[n+1] job_id
  ARGV[n+2] token   the lock token it was fetched with

  Returns one code per pair, in order: 1 renewed; 2 renewed, and the job was
  cancelled (`cxl`, set by cancelJob): the worker is to stop it; 0 not
  renewed, because this very token already finished the job (`ftk`: a
  renewal racing the worker's own finish, nothing is wrong); -1 not renewed,
  ownership lost.
  With a single pair this is also how one lock is renewed.
]]
-- @include "lockIndex"

local prefix, lockMs = ARGV[1], ARGV[2]
local locksKey, lapsesAt = prefix .. "locks", redisNowMs() + tonumber(lockMs)
local codes = {}
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local jobKey = prefix .. id
  -- pcall: a job key another client overwrote must not stop the other renewals.
  local owner = redis.pcall("HMGET", jobKey, "tok", "ftk", "cxl")
  if owner["err"] then owner = {} end
  if owner[1] == token then
    -- PXAT: the lock lapses at exactly the time the index records.
    redis.call("SET", jobKey .. ":lock", token, "PXAT", lapsesAt)
    redis.call("ZADD", locksKey, "XX", lapsesAt, id)  -- XX: only ids that are in `active`
    redis.call("SREM", KEYS[1], id)
    codes[#codes + 1] = owner[3] and 2 or 1
  elseif owner[2] == token then
    codes[#codes + 1] = 0
  else
    codes[#codes + 1] = -1
  end
end
return codes
