"""equeue's name server (``equeue-namesrv``): where a cluster's topics live.

Light and stateless, as RocketMQ's: brokers register with every name server
(routes.py keeps what they say, in memory only), clients ask any name server
for a topic's route. It imports the contract and the server's start-up and
logging helpers, never the storage engine.
"""
