-- The `broken` lines of a fetch's reply (moveToActive's header): one for each
-- key another client broke (another type, a value no script writes) that the
-- fetch met, each said once per call. The caller puts `brokenLines` in its
-- reply; the flow gate and the group ring add to it.
local brokenLines, brokenSaid = {}, {}

-- A line for the reply's `broken`, once per call.
local function reportBroken(line)
  if brokenSaid[line] then return end
  brokenSaid[line] = true
  brokenLines[#brokenLines + 1] = line
end

-- `key` holds another type than `expected` (another client's key): say so, and what it stops.
local function reportWrongType(key, expected, stops)
  if brokenSaid[key] then return end
  brokenSaid[key] = true
  reportBroken(key .. " holds a " .. redis.call("TYPE", key)["ok"] .. ", not a " .. expected .. ": " .. stops)
end
