-- Put a ready job id where workers take it from: `wait`, or `paused` while the
-- queue is paused. Only `wait` gets the marker, since paused jobs must not
-- wake anybody.
local function pushReady(waitKey, pausedKey, metaKey, markerKey, id)
  if redis.call("HEXISTS", metaKey, "paused") == 1 then
    redis.call("LPUSH", pausedKey, id)
  else
    redis.call("LPUSH", waitKey, id)
    redis.call("ZADD", markerKey, 0, "0")
  end
end
