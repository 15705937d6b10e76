"""The flash worker (issue 12): re-answers data sessions' registered questions
after every data version and pushes them (`flash_ready`) before anyone asks.

Its own process (`python -m services.flash`): it consumes the Redis stream of
data versions with the consumer group `flash`, asks the owning replica to
evaluate the questions in place (`Engine.DataEvaluate`), stores the answers in
Redis (`headstart.data.live_store`) and acknowledges the entry after that.
"""
