"""The prefix-caching baseline: a token-id radix tree of KV, as SGLang's RadixCache keeps it.

Every served prompt's KV is inserted into a radix tree over token ids; each
edge holds the keys/values of its tokens `# per layer [1, kv_heads, tokens, head_dim]`.
A new prompt reuses the KV of its longest prefix found in the tree (token
granularity, which favours the baseline over vLLM's 16-token blocks) and
computes the rest. Shared prefixes are stored once. When the tree holds more
than `max_bytes`, least recently used leaves are evicted (SGLang's policy).

Only exact prefixes are reused: two prompts listing the same tables in a
different order share nothing past the first difference, which is the case
the table cache is built for.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headstart.engine.kv.state import KVState, state_from_layers
from headstart.prompt import common_prefix_len


class _Node:
    __slots__ = ("tokens", "keys", "values", "children", "parent", "last_used")

    def __init__(self, tokens: tuple[int, ...], keys: list[torch.Tensor], values: list[torch.Tensor],
                 parent: "_Node | None") -> None:
        self.tokens = tokens  # edge label from the parent
        self.keys, self.values = keys, values  # per layer [1, kv_heads, len(tokens), head_dim]
        self.children: dict[int, _Node] = {}  # first token of the child's edge -> child
        self.parent = parent
        self.last_used = 0

    @property
    def num_bytes(self) -> int:
        return sum(t.nbytes for t in self.keys) + sum(t.nbytes for t in self.values)


@dataclass(frozen=True)
class RadixMatch:
    """The longest cached prefix of a prompt: `num_tokens` tokens, their KV in `state` (None when 0)."""

    num_tokens: int
    state: KVState | None


class RadixCache:
    """Longest-prefix KV reuse over token ids, LRU-evicted by bytes (see module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._root = _Node((), [], [], None)
        self._tick = itertools.count(1)
        self.num_bytes = 0
        self.num_evictions = 0

    def _walk(self, ids: Sequence[int]) -> list[tuple[_Node, int]]:
        """(node, tokens of its edge that match) along the longest matching path."""
        path, node, i = [], self._root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                break
            n = common_prefix_len(child.tokens, ids[i:])
            path.append((child, n))
            i += n
            if n < len(child.tokens):
                break
            node = child
        return path

    def match(self, ids: Sequence[int]) -> RadixMatch:
        """A fresh KVState holding the longest cached prefix of `ids` (marks the path used)."""
        path = self._walk(ids)
        tick = next(self._tick)
        for node, _ in path:
            node.last_used = tick
        num = sum(n for _, n in path)
        if num == 0:
            return RadixMatch(0, None)
        layers = [(torch.cat([node.keys[layer][:, :, :n] for node, n in path], dim=2),
                   torch.cat([node.values[layer][:, :, :n] for node, n in path], dim=2))
                  for layer in range(len(path[0][0].keys))]
        return RadixMatch(num, state_from_layers(list(ids[:num]), layers))

    def insert(self, ids: Sequence[int], state: KVState) -> int:
        """Store the KV of `ids` (held by `state`, which may hold more); returns tokens newly stored."""
        if len(state.ids) < len(ids) or list(state.ids[:len(ids)]) != list(ids):
            raise ValueError("the state does not hold these token ids")
        tick = next(self._tick)
        node, i = self._root, 0
        for child, n in self._walk(ids):
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_used = tick
            node, i = child, i + n
        if i == len(ids):
            return 0
        layers = state.cache.layers
        leaf = _Node(tuple(ids[i:]), [layer.keys[:, :, i:len(ids)].clone() for layer in layers],
                     [layer.values[:, :, i:len(ids)].clone() for layer in layers], node)
        leaf.last_used = tick
        node.children[ids[i]] = leaf
        self.num_bytes += leaf.num_bytes
        self._evict()
        return len(ids) - i

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut `node`'s edge after `n` tokens; returns the new upper node."""
        upper = _Node(node.tokens[:n], [k[:, :, :n].clone() for k in node.keys],
                      [v[:, :, :n].clone() for v in node.values], node.parent)
        upper.last_used = node.last_used
        node.parent.children[node.tokens[0]] = upper
        node.tokens = node.tokens[n:]
        node.keys = [k[:, :, n:].clone() for k in node.keys]
        node.values = [v[:, :, n:].clone() for v in node.values]
        node.parent = upper
        upper.children[node.tokens[0]] = node
        return upper

    def _evict(self) -> None:
        while self.num_bytes > self.max_bytes:
            leaves = [n for n in self._nodes() if not n.children]
            if not leaves:
                return
            victim = min(leaves, key=lambda n: n.last_used)
            del victim.parent.children[victim.tokens[0]]
            self.num_bytes -= victim.num_bytes
            self.num_evictions += 1

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    @property
    def num_tokens(self) -> int:
        """Tokens stored (each shared prefix once)."""
        return sum(len(n.tokens) for n in self._nodes())
