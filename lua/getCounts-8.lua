--[[
  getCounts: the number of jobs in each state, read in one atomic step so the
  numbers are consistent with each other.

  KEYS[1] wait       LIST
  KEYS[2] paused     LIST
  KEYS[3] active     LIST
  KEYS[4] delayed    ZSET
  KEYS[5] completed  ZSET
  KEYS[6] failed     ZSET
  KEYS[7] stalled    SET   (marked jobs; they are also counted in active)
  KEYS[8] prioritized ZSET

  Returns {wait, paused, active, delayed, completed, failed, stalled, prioritized}.
]]
return {
  redis.call("LLEN", KEYS[1]), redis.call("LLEN", KEYS[2]), redis.call("LLEN", KEYS[3]),
  redis.call("ZCARD", KEYS[4]), redis.call("ZCARD", KEYS[5]), redis.call("ZCARD", KEYS[6]),
  redis.call("SCARD", KEYS[7]), redis.call("ZCARD", KEYS[8]),
}
