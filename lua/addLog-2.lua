--[[
  addLog: append one line to a running job's log, for the attempt that owns
  the job only (the token check of updateProgress), and keep the newest
  lines up to a cap, so a chatty job cannot fill Redis.

  KEYS[1] <id>       HASH  the job
  KEYS[2] <id>:logs  LIST  its log lines, oldest first

  ARGV[1] the attempt's lock token
  ARGV[2] the line
  ARGV[3] lines to keep at most (the oldest go)

  Returns the number of lines kept after the append, 0 when the token does
  not own the job (nothing written), -1 when the job hash does not exist.
]]

local owner = redis.pcall("HGET", KEYS[1], "tok")
if type(owner) ~= "string" then
  if redis.call("EXISTS", KEYS[1]) == 0 then return -1 end
  return 0
end
if owner ~= ARGV[1] then return 0 end
local length = redis.call("RPUSH", KEYS[2], ARGV[2])
local keep = tonumber(ARGV[3])
if length > keep then
  redis.call("LTRIM", KEYS[2], -keep, -1)
  length = keep
end
return length
