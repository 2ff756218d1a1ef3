"""Speculative decoding: cheap guesses of a sequence's next tokens (drafts), verified by one
forward of the model over all of them, so a step can yield several tokens for about the cost of
one (config.py, the methods; ngram.py, prompt lookup; draft_length.py, adaptive lengths).
"""
