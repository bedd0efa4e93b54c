--[[
  closeSchedule: close a schedule's record on a queue the schedule has left,
  and say up to which tick that queue decided. A scheduler that finds a
  schedule on a new queue closes its records on the others before it fires
  there, and fires only ticks after the newest tick they decided; a closed
  record decides no tick again (fireSchedule answers "moved"), so a
  scheduler that still fires the schedule's old version there adds nothing,
  and each tick is decided on one queue only. A fireSchedule call that
  opens the record (the schedule came back to this queue) opens it again.

  KEYS[1] schedule:<name> HASH  the schedule's record on the queue it left

  Returns the newest tick decided there (ms): the record's `closed` when it
  was closed before, else its `tick` (0 when it has none, or not a number),
  which it stores as `closed`. False when there is no record (nothing is
  written). A record of another type is an error.
]]

local fields = redis.call("HMGET", KEYS[1], "closed", "tick")
local closed = fields[1] and tonumber(fields[1])
if closed then return closed end
if redis.call("EXISTS", KEYS[1]) == 0 then return false end
local tick = fields[2] and string.match(fields[2], "^%d+$") and tonumber(fields[2]) or 0
redis.call("HSET", KEYS[1], "closed", tick)
return tick
