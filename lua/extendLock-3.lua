--[[
  extendLock: renew one job's lock for the worker that owns it, and clear the
  job's stalled mark (a live worker proves the job has not stalled).

  Ownership is the job's `tok` field, which moveToActive sets and every move
  out of `active` clears. If the lock key lapsed (the worker was paused) but
  the job was not recovered meanwhile, `tok` still matches and the lock is
  taken back: that is the grace the two-phase sweep gives a paused worker.

  KEYS[1] stalled   SET
  KEYS[2] job hash
  KEYS[3] job lock  STRING, PX

  ARGV[1] worker token
  ARGV[2] lock duration, ms
  ARGV[3] job id

  Returns 1 when the lock is held for another ARGV[2] ms, 0 when the worker no
  longer owns the job (its lock was lost: recovered, removed or finished).
]]
if redis.call("HGET", KEYS[2], "tok") ~= ARGV[1] then
  return 0
end
redis.call("SET", KEYS[3], ARGV[1], "PX", ARGV[2])
redis.call("SREM", KEYS[1], ARGV[3])
return 1
