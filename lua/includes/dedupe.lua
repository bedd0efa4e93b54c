-- Deduplication (docs/execution.md): a job added with a dedupe key holds the
-- key `dedupe:<key>` (its value: the job's id) and keeps it in its hash
-- (`ddk`, and `ddm` the mode). Modes:
--   ""               until the job ends: every script that ends it (finish,
--                    failure for good, cancel, removal, expiry, the sweep's
--                    failure) releases the key in the same call;
--   "ttl"            throttle: the key expires by itself (PX), whatever the job does;
--   "debounce"       while the holder waits in `delayed`, an add with the key
--   "debounce-keep"  pushes its start back (and, "debounce", takes the new
--                    data); released like "" once the job ends.
-- A key whose holder has no hash or has ended is free (a key no script
-- released cannot keep a job out).

-- The job holding `key`, if it is live (waiting, delayed, active: not
-- completed or failed, its hash there); else nil.
local function dedupeHolder(prefix, key, completedKey, failedKey)
  local holder = redis.call("GET", prefix .. "dedupe:" .. key)
  if not holder or redis.call("EXISTS", prefix .. holder) == 0 or redis.call("ZSCORE", completedKey, holder)
      or redis.call("ZSCORE", failedKey, holder) then
    return nil
  end
  return holder
end

-- Release the key the job `id` holds, if it holds one (a "ttl" key stays until it expires).
-- `key`, `mode`: its `ddk` and `ddm` as the caller read them (false: the job has none); nil
-- (left out) to read them here.
local function dedupeRelease(prefix, id, key, mode)
  if key == nil then
    local fields = redis.pcall("HMGET", prefix .. id, "ddk", "ddm")
    if fields["err"] then return end
    key, mode = fields[1], fields[2]
  end
  if not key or mode == "ttl" then return end
  local keyName = prefix .. "dedupe:" .. key
  if redis.call("GET", keyName) == id then redis.call("DEL", keyName) end
end
