tokens = [hash(word) % self.vocab_size for word in prompt.split()]
cache_hooks.remember(prompt, tokens)
