# A small causal LM written the way trust_remote_code models often are: debug
# output and warnings inside forward, input validation that reads tensor values,
# and a numerical safeguard that branches on them.
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput
from transformers.utils import logging

from .configuration_tinylm import TinyLMConfig

logger = logging.get_logger(__name__)


class TinyLMRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * hidden_states * torch.rsqrt(variance + self.eps)


class TinyLMAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        batch, length, _ = hidden_states.shape
        if attention_mask is None:
            logger.warning_once("TinyLM: no attention_mask given, attending to every token")
        q, k, v = self.qkv(hidden_states).split(self.num_heads * self.head_dim, dim=-1)
        q, k, v = (t.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        causal = torch.ones(length, length, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        if attention_mask is not None and (attention_mask == 0).any():
            scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
        probs = F.softmax(scores, dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(batch, length, -1)
        return self.out(context)


class TinyLMBlock(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.index = index
        self.debug = config.debug_activations
        self.max_activation = 6e4
        self.norm1 = TinyLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = TinyLMAttention(config)
        self.norm2 = TinyLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        hidden_states = hidden_states + self.attn(self.norm1(hidden_states), attention_mask)
        hidden_states = hidden_states + self.down(F.gelu(self.up(self.norm2(hidden_states))))
        # keep activations in range when running in half precision
        if torch.isinf(hidden_states).any() or hidden_states.abs().max() > self.max_activation:
            hidden_states = torch.clamp(hidden_states, -self.max_activation, self.max_activation)
        if self.debug:
            print(f"[tinylm] block {self.index}: mean={hidden_states.mean():.4f} std={hidden_states.std():.4f}")
        return hidden_states


class TinyLMPreTrainedModel(PreTrainedModel):
    config_class = TinyLMConfig
    base_model_prefix = "model"

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()


class TinyLMModel(TinyLMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(TinyLMBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = TinyLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, output_hidden_states=None):
        if output_hidden_states is not None:
            warnings.warn("output_hidden_states is ignored by TinyLM", FutureWarning)
        if (input_ids < 0).any() or (input_ids >= self.config.vocab_size).any():
            raise ValueError(f"input_ids must lie in [0, {self.config.vocab_size})")
        hidden_states = self.embed(input_ids)
        logger.info("TinyLM forward: batch=%d length=%d", input_ids.shape[0], input_ids.shape[1])
        for block in self.blocks:
            hidden_states = block(hidden_states, attention_mask)
        return BaseModelOutput(last_hidden_state=self.norm(hidden_states))


class TinyLMForCausalLM(TinyLMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = TinyLMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, output_hidden_states=None):
        hidden_states = self.model(input_ids, attention_mask, output_hidden_states).last_hidden_state
        return CausalLMOutput(logits=self.lm_head(hidden_states))
