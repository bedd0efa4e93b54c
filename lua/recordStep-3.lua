--[[
  recordStep: record one durable step of a running job (docs/durable.md), for
  the attempt that owns the job only, and the first time only: a step already
  recorded answers with its record, so every attempt replays the same result.

  A record is JSON written by the worker, its state first (`{"s":"done",...}`).
  "done" and "timeout" are final: nothing replaces them. "failed" (the step's
  latest error) and "waiting" (a signal wait not over yet, with its deadline)
  are not: a later call of the same step replaces them.

  A signal wait (no record given; ARGV[3] "signal", or "fan-out": the wait for
  a fan-out's children, whose last hands their results over as a signal) decides here, against the signals sent so
  far (KEYS[3], written by signalJob): a signal that came is recorded as the
  step's result ("done", its payload in `r`); past the wait's deadline, the
  step is recorded as "timeout"; else the wait is recorded as "waiting" with
  its deadline (kept from the first call, so a re-run does not extend it) and
  the worker parks the job (moveToFinished's "parked").

  KEYS[1] <id>          HASH  the job (`tok`: the owning attempt's token)
  KEYS[2] <id>:steps    HASH  step name -> record
  KEYS[3] <id>:signals  HASH  "p:<name>" -> payload (JSON) of each signal sent

  ARGV[1] token      the attempt's lock token
  ARGV[2] name       the step's name
  ARGV[3] kind       the step's kind, as the records written here name it ("signal", "fan-out")
  ARGV[4] record     the record to write; "" for a signal wait
  ARGV[5] max_steps  steps a job may record at most
  ARGV[6] now        ms (a signal wait's clock)
  ARGV[7] deadline   a signal wait's deadline, ms (0 = none), used by its first call

  Returns
    {1, record}    written by this call
    {0, record}    recorded before, final: the record to replay
    {2, deadline}  a signal wait with no signal yet: park until the deadline (0 = none)
    {-1}           the job hash does not exist
    {-2}           the token does not own the job: its attempt lost it
    {-4, count}    the job has recorded max_steps steps: nothing written
]]

local jobKey, stepsKey, signalsKey = KEYS[1], KEYS[2], KEYS[3]
local token, name, kind, record = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local maxSteps, now, deadline = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]) or 0

local owner = redis.pcall("HGET", jobKey, "tok")
if type(owner) ~= "string" then
  if redis.call("EXISTS", jobKey) == 0 then return {-1} end
  return {-2}
end
if owner ~= token then return {-2} end

local before = redis.pcall("HGET", stepsKey, name)
if type(before) == "table" and before["err"] then return redis.error_reply(before["err"]) end
if before and (string.sub(before, 1, 11) == '{"s":"done"' or string.sub(before, 1, 14) == '{"s":"timeout"') then
  return {0, before}
end
if not before then
  local count = redis.call("HLEN", stepsKey)
  if count >= maxSteps then return {-4, count} end
end

if record == "" then  -- a wait
  if before then  -- a wait that began in an earlier attempt keeps its deadline
    deadline = tonumber(string.match(before, '"until":(%d+)')) or 0
  end
  local payload = redis.call("HGET", signalsKey, "p:" .. name)
  if payload then
    record = '{"s":"done","k":"' .. kind .. '","at":' .. now .. ',"r":' .. payload .. '}'
  elseif deadline > 0 and now >= deadline then
    record = '{"s":"timeout","k":"' .. kind .. '","at":' .. now .. ',"until":' .. deadline .. '}'
  else
    if not before then
      redis.call("HSET", stepsKey, name, '{"s":"waiting","k":"' .. kind .. '","at":' .. now .. ',"until":' .. deadline .. '}')
    end
    return {2, deadline}
  end
end
redis.call("HSET", stepsKey, name, record)
return {1, record}
