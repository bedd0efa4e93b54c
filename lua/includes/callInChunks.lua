-- Run `command` once per 1,000 of `items` rather than once per item: `command
-- first item...`, or `command item...` when `first` is nil (a DEL of keys).
-- Lua's unpack takes a few thousand values at most, so no call gets more.
local function callInChunks(command, first, items)
  for from = 1, #items, 1000 do
    local to = math.min(from + 999, #items)
    if first then
      redis.call(command, first, unpack(items, from, to))
    else
      redis.call(command, unpack(items, from, to))
    end
  end
end
