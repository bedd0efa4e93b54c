--[[
  addLog: append one line to a running job's log, for the attempt that owns
  the job only (the token check of updateProgress), and keep the newest
  lines up to a cap, so a chatty job cannot fill Redis. Each call carries
  an id of its own, recorded in the job's `lgi`: a call re-sent after a lost
  reply finds its id there and appends nothing the second time.

  KEYS[1] <id>       HASH  the job
  KEYS[2] <id>:logs  LIST  its log lines, oldest first

  ARGV[1] token    the attempt's lock token
  ARGV[2] line     the line
  ARGV[3] keep     lines to keep at most (the oldest go)
  ARGV[4] call_id  this call's id (unique per line)

  Returns the number of lines kept after the append, 0 when the token does
  not own the job (nothing written), -1 when the job hash does not exist.
]]

local fields = redis.pcall("HMGET", KEYS[1], "tok", "lgi")
if fields["err"] or not fields[1] then
  if redis.call("EXISTS", KEYS[1]) == 0 then return -1 end
  return 0
end
if fields[1] ~= ARGV[1] then return 0 end
if fields[2] == ARGV[4] then return redis.call("LLEN", KEYS[2]) end  -- a re-send: already appended
local length = redis.call("RPUSH", KEYS[2], ARGV[2])
redis.call("HSET", KEYS[1], "lgi", ARGV[4])
local keep = tonumber(ARGV[3])
if length > keep then
  redis.call("LTRIM", KEYS[2], -keep, -1)
  length = keep
end
return length
