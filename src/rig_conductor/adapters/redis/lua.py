"""Every Lua script the code base runs in Redis, by name (as arq keeps its scripts in one
`lua.py`). Callers register them where they run (`client.register_script(lua.APPEND_ONCE)`) or
`EVAL` them; nothing else is here.

A script touches only the keys it is handed (KEYS), which on a Redis Cluster share the stream's
hash slot (`keys`). The lease scripts are the TypeScript runtime's too, byte for byte
(clients/typescript/src/lease.ts): the two runtimes exclude each other on one consumer name.
"""

# The dispatch stream's writes (`streams`).

# Append an entry at most once per idempotency key, atomically: a repeat, however concurrent and
# whatever crashed in between, gets the first entry's id and appends nothing.
# KEYS: stream, the key's marker. ARGV: marker TTL in seconds, then field, value, ...
# Returns {entry id, 1 if appended now else 0}.
APPEND_ONCE = """
local existing = redis.call('GET', KEYS[2])
if existing then return {existing, 0} end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[2], id, 'EX', tonumber(ARGV[1]))
return {id, 1}
"""

# Set the stream's epoch marker unless one is there; either way answer the one that is.
# KEYS: the marker. ARGV: a new epoch. Returns {epoch, 1 if set now else 0}.
CLAIM_EPOCH = """
local existing = redis.call('GET', KEYS[1])
if existing then return {existing, 0} end
redis.call('SET', KEYS[1], ARGV[1])
return {ARGV[1], 1}
"""

# The Lua both dead-letter scripts share: appends an entry's fields, less the diagnostics a
# dead letter carries (`streams._DIAGNOSTICS`), to `fields`; returns its issueId, or false.
_OWN_FIELDS = """
local function own_fields(stored, fields)
  local reserved = {originalId=true, stream=true, group=true,
                    consumer=true, deliveries=true, reason=true}
  local issue = false
  for i = 1, #stored, 2 do
    if not reserved[stored[i]] then
      table.insert(fields, stored[i])
      table.insert(fields, stored[i + 1])
    end
    if stored[i] == 'issueId' then issue = stored[i + 1] end
  end
  return issue
end
"""

# Dead-letter one entry atomically, guarded like XCLAIM: only if it is still pending for the
# same consumer and still at least as idle as the scan saw it. Copies the entry with its
# diagnostics to the DLQ stream, then XACKs it on the source.
# KEYS: stream, dlq. ARGV: group, consumer, id, min-idle, reason, deliveries known elsewhere
# (the recorded attempts); the DLQ's `deliveries` is the larger count.
DEAD_LETTER = (
    _OWN_FIELDS
    + """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[4],
                           ARGV[3], ARGV[3], 1, ARGV[2])
if #pending == 0 then return false end
local deliveries = math.max(pending[1][4], tonumber(ARGV[6]))
local fields = {'originalId', ARGV[3], 'stream', KEYS[1], 'group', ARGV[1],
                'consumer', ARGV[2], 'deliveries', tostring(deliveries), 'reason', ARGV[5]}
local found = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
local issue = false
if #found == 1 then
  issue = own_fields(found[1][2], fields)
else
  fields[12] = ARGV[5] .. '; entry no longer in the stream'
end
local dlq_id = redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
return {dlq_id, deliveries, issue}
"""
)

# Requeue one dead letter: append its original fields to its stream as a new entry and delete it
# from the DLQ, atomically. KEYS: dlq, stream. ARGV: dlq id. Returns {new id, issueId} or nil.
REQUEUE = (
    _OWN_FIELDS
    + """
local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #found == 0 then return false end
local fields = {}
local issue = own_fields(found[1][2], fields)
if #fields == 0 then fields = {'requeuedFrom', ARGV[1]} end
local new_id = redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XDEL', KEYS[1], ARGV[1])
return {new_id, issue}
"""
)

# Delete a consumer only if it still has no pending entry, checked in the same atomic step.
# XPENDING <stream> <group> - + 1 <consumer> exists on Redis 6.2 and 7.x alike.
# KEYS: stream. ARGV: group, consumer. Returns -1 when refused, else DELCONSUMER's reply.
DELETE_EMPTY_CONSUMER = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then return -1 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
"""

# The scan's reads (`consumer_summary`, `lag`).

# Reply: the number of consumers, then name, pending, idle and inactive (-1: not reported, Redis
# before 7.2, or never read) of each consumer holding entries and of the first ARGV[2] others.
CONSUMER_SUMMARY = """
local rows = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local others = tonumber(ARGV[2])
local out = {#rows}
for _, row in ipairs(rows) do
  local name, pending, idle, inactive
  if row[1] == 'name' and row[3] == 'pending' and row[5] == 'idle' then
    name, pending, idle = row[2], row[4], row[6]  -- Redis's order: no table per row
    if row[7] == 'inactive' then inactive = row[8] end
  else
    local f = {}
    for j = 1, #row, 2 do f[row[j]] = row[j + 1] end
    name, pending, idle, inactive = f['name'], f['pending'], f['idle'], f['inactive']
  end
  local holds = pending > 0
  if holds or others > 0 then
    if not holds then others = others - 1 end
    out[#out + 1] = name
    out[#out + 1] = pending
    out[#out + 1] = idle
    out[#out + 1] = inactive or -1
  end
end
return out
"""

# Count the entries after a group's last-delivered id, up to a cap (`lag`).
# KEYS: stream. ARGV: the group's last-delivered id, the cap.
GROUP_LAG = """
local n, cap = 0, tonumber(ARGV[2])
local start = '(' .. ARGV[1]
while n < cap do
  local batch = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1000)
  if #batch == 0 then break end
  n = n + #batch
  start = '(' .. batch[#batch][1]
end
return n
"""

# The consumer-name lease of an agent (`rig_conductor.agent.lease`).

# Renew the lease only while this instance holds it; take it again if it expired meanwhile.
LEASE_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"""

# The holder and the time it has left, in one look.
LEASE_HOLDER = """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""

LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
