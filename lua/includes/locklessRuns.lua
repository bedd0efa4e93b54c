-- Call visit(from, to) for each run ids[from..to] whose lock keys
-- (prefix .. id .. ":lock") are all gone; at most 1,000 ids, since they are
-- unpacked into one command. One EXISTS over all their lock keys settles the
-- common cases in a single call: every lock there (the steady state) or none;
-- a mixed range is split in two and each half tested again, so k lockless ids
-- among n cost about k * log2(n / k) calls.
local function forLockless(prefix, ids, from, to, visit)
  local lockKeys = {}
  for i = from, to do lockKeys[#lockKeys + 1] = prefix .. ids[i] .. ":lock" end
  local locked = redis.call("EXISTS", unpack(lockKeys))
  if locked == #lockKeys then return end
  if locked == 0 or from == to then return visit(from, to) end
  local middle = math.floor((from + to) / 2)
  forLockless(prefix, ids, from, middle, visit)
  forLockless(prefix, ids, middle + 1, to, visit)
end
