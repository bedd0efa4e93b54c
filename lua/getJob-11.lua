--[[
  getJob: a job's hash, its log and the state that holds it, read in one
  step. The sorted sets are asked first (ZSCORE, constant time), then the
  lists (LPOS, a scan), active before paused before wait: a job that has
  finished is found without scanning a backlog of waiting jobs. Writes
  nothing.

  KEYS[1] wait        LIST
  KEYS[2] prioritized ZSET
  KEYS[3] paused      LIST
  KEYS[4] active      LIST
  KEYS[5] delayed     ZSET
  KEYS[6] deferred    ZSET  a workflow's steps waiting for their inputs
  KEYS[7] parked      ZSET  durable jobs waiting for a signal (includes/parked.lua)
  KEYS[8] completed   ZSET
  KEYS[9] failed       ZSET
  KEYS[10] <id>       HASH  the job
  KEYS[11] <id>:logs  LIST  its log lines

  ARGV[1] job_id
  ARGV[2] log_lines  "state" for the state alone, else how many of the newest log
          lines to return (-1: all)
  ARGV[3] prefix     key prefix of the queue: a job with a group may wait in its
          group's list (includes/groups.lua), named from the prefix

  A job waiting in its group's list is in state "wait".

  Returns {state} for "state", else {state, fields, lines kept, lines}:
  state is the name of the state key that holds the id (false: none),
  fields the job hash as a flat field/value list (empty when there is no
  hash, false when its key holds another type), lines the newest log lines,
  oldest first.
]]
-- @include "groups"

local id = ARGV[1]
local state = false
for _, i in ipairs({2, 5, 6, 7, 8, 9}) do
  if redis.call("ZSCORE", KEYS[i], id) then
    state = i
    break
  end
end
if not state then
  for _, i in ipairs({4, 3, 1}) do
    if redis.call("LPOS", KEYS[i], id) then
      state = i
      break
    end
  end
end
local names = {"wait", "prioritized", "paused", "active", "delayed", "deferred", "parked", "completed", "failed"}
state = state and names[state]
if not state then
  local group = groupOf(redis.pcall("HGET", KEYS[10], "grp"))
  if group and redis.call("LPOS", ARGV[3] .. "group:" .. group, id) then state = "wait" end
end
if ARGV[2] == "state" then return {state} end

local fields = redis.pcall("HGETALL", KEYS[10])
if fields["err"] then fields = false end
local kept, lines = 0, {}
local logType = redis.call("TYPE", KEYS[11])["ok"]
if logType == "list" then
  kept = redis.call("LLEN", KEYS[11])
  local wanted = tonumber(ARGV[2])
  if wanted ~= 0 then
    lines = redis.call("LRANGE", KEYS[11], wanted < 0 and 0 or -wanted, -1)
  end
end
return {state, fields, kept, lines}
