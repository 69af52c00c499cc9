"""Redis adapters: clients for every topology, the streams' reads and writes, and the Lua
scripts they run (`lua`). Thin I/O: no decisions are made here."""
