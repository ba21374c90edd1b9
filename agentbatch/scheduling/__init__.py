"""The pure policy core: types, the coordinator state machine (`core`), queue policies (FIFO, CAAS),
routers, request priorities, admission order and the makespan lower bound.

No asyncio, no I/O, no Prefect, no database: the live runner (`tasks`) and the virtual-time driver
(`sim.virtual_time`) both drive the same objects. Imports no other agentbatch room.
"""
