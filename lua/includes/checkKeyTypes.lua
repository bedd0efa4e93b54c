-- Before a script writes anything: each of `expected` ({key, Redis type}
-- pairs) must be missing or of its type. Returns nil when all are, else the
-- error reply naming the first that is not, with `consequence` appended.
local function checkKeyTypes(expected, consequence)
  for _, pair in ipairs(expected) do
    local actual = redis.call("TYPE", pair[1])["ok"]
    if actual ~= "none" and actual ~= pair[2] then
      return redis.error_reply("ERR echomq wrong type: " .. pair[1] .. " holds a " .. actual ..
        ", expected a " .. pair[2] .. "; " .. consequence)
    end
  end
  return nil
end
