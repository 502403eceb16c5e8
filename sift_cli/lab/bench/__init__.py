"""Speed, measured side by side in one process: `attention_kernels` (`sift bench kernels`) and its device check
`kernel_check`, `profile` (`sift bench profile`), `prefill` with `prefill_cases`, `energy` and `host_kv`
(`sift bench prefill`), and `llama` (random-weight Llama models of published shapes)."""
