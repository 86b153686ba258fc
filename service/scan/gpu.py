"""A batch of texts' scan statistics on the GPU (:mod:`watermark.kernels.keyscan`), for
:func:`detector.multikey.detect_many` to finish on the CPU.

Per (context width, dedup scope) the batch's scored positions are packed once; per key
group (one spec) one launch computes every key x text; the statistics come back as int64,
equal bit for bit to the CPU pass's (the kernel's parity tests), so a scan's verdicts are
the same on either device.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from detector.detect import DetectorConfig, positions_key
from detector.multikey import KeySet, group_tables, plan
from watermark import jit, keyscan
from watermark.dedup import first_occurrence_mask


class GpuScanner:
    """The kernel's inputs that do not change between batches (keys, tables on the device)."""

    def __init__(self, keyset: KeySet, config: DetectorConfig, device: str = "cuda") -> None:
        import torch

        from watermark.kernels import keyscan as kernel

        if device == "interpret":  # the kernel's logic on CPU tensors (tests: TRITON_INTERPRET=1)
            if os.environ.get("TRITON_INTERPRET") != "1":
                raise ValueError("device 'interpret' needs TRITON_INTERPRET=1 set before Triton is imported")
            device = "cpu"
        elif not torch.cuda.is_available():
            raise ValueError("no CUDA device: scan on the CPU (--device cpu) or on a machine with a GPU")
        self.torch, self.kernel = torch, kernel
        self.device = torch.device(device)
        self.keyset = keyset
        # Which Tr-GoF p-values a group reads does not depend on the text (only its spans do).
        self.plans = [p for p in (plan(g, keyset.candidates, config, with_spans=False) for g in keyset.groups)
                      if p.screened]
        self.keys = []
        for p in self.plans:
            if p.group.wide is not None:
                # 256-bit keys: hmac-sha256-philox-v1's midstates for its kernel; vLLM's per-token
                # HMAC (hmac-sha256-v1) has no kernel: its words come from the CPU pass (None).
                self.keys.append(self._wide_keys(p.group))
                continue
            a = torch.from_numpy(p.group.keys_a.view(np.int64)).to(self.device)
            b = None if p.group.keys_b is None else torch.from_numpy(p.group.keys_b.view(np.int64)).to(self.device)
            self.keys.append((a, b))
        self._tables: dict[tuple[int, int], object] = {}

    def _wide_keys(self, group):
        from watermark import prf

        if prf.canonical_name(group.spec.prf) != prf.HMAC_PHILOX_V1:
            return None
        from watermark.kernels.keyscan_hmac import midstates_tensor

        keys_a, keys_b = group.wide
        return midstates_tensor(keys_a, keys_b, self.device), keys_b is not None

    def _cpu_wide(self, number: int, contexts, tokens, offsets, longest: int) -> np.ndarray:
        """Statistics [T, g, 4] of a 256-bit group without a kernel: the PRF's compiled words."""
        from watermark import prf

        p = self.plans[number]
        impl = prf.lookup(p.group.spec.prf)
        keys_a, keys_b = p.group.wide
        words_a = impl.words_many(keys_a, contexts, tokens)
        words_b = None if keys_b is None else impl.words_many(keys_b, contexts, tokens)
        return keyscan.scan_stats_from_words(words_a, words_b, offsets, group_tables(p, longest))

    def _device_tables(self, number: int, longest: int):
        size = max(1024, 1 << max(0, longest).bit_length())
        key = (number, size)
        if key not in self._tables:
            self._tables[key] = self.kernel.DeviceTables(group_tables(self.plans[number], longest), self.device)
        return self._tables[key]

    def stats(self, forms: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Scan statistics [K, 4] (candidates' order; rows of unscreened keys 0) of each form."""
        torch = self.torch
        count = len(self.keyset.candidates)
        out = np.zeros((len(forms), count, len(keyscan.STATS)), dtype=np.int64)
        if not forms or not self.plans:
            return list(out)
        mask = None
        if jit.loaded():
            from watermark import dedup_compiled

            mask = dedup_compiled.first_occurrence_mask
        packed: dict[tuple[int, str], tuple] = {}
        for number, p in enumerate(self.plans):
            family = positions_key(p.group.spec)
            if family not in packed:
                width = p.group.spec.context_width
                contexts, tokens, offsets = keyscan.pack_positions(forms, width, skip_padded=(family[1] == "all"),
                                                                   mask=mask or first_occurrence_mask)
                from watermark.keyscan_cpu import context_columns

                columns = torch.from_numpy(context_columns(contexts).view(np.int32)).to(self.device)
                toks = torch.from_numpy((tokens & 0xFFFFFFFF).astype(np.uint32).view(np.int32)).to(self.device)
                offs = torch.from_numpy(offsets).to(self.device)
                packed[family] = (columns, toks, offs, width, int(np.diff(offsets).max(initial=0)),
                                  (contexts, tokens, offsets))
            columns, toks, offs, width, longest, host = packed[family]
            if longest > keyscan.MAX_POSITIONS:
                raise ValueError(f"a text has more than {keyscan.MAX_POSITIONS} scored tokens")
            keys = self.keys[number]
            if p.group.wide is not None:
                if keys is None:
                    out[:, p.group.indices] = self._cpu_wide(number, *host, longest)
                    continue
                from watermark.kernels.keyscan_hmac import scan_stats_hmac

                mids, dual = keys
                result = scan_stats_hmac(mids, dual, columns, toks, offs, width, self._device_tables(number, longest),
                                         keys_per_program=4)
            else:
                keys_a, keys_b = keys
                result = self.kernel.scan_stats(keys_a, keys_b, columns, toks, offs, width,
                                                self._device_tables(number, longest), keys_per_program=16)
            out[:, p.group.indices] = result.cpu().numpy()
        return list(out)
