"""OptimusModel behaviour beyond the fixture: generation modes, batching, padding, the latent choice in training and
eval, losses, the latent-feature classifier and the processor. Sizes differ from the fixture's on purpose."""

import pytest
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, AutoProcessor, BertTokenizer, GPT2Tokenizer

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext import OptimusForSequenceClassification, OptimusLatentSpace, OptimusModel, OptimusProcessor
from hf_ext.models.optimus import kl_divergence, kl_per_dimension
from hf_ext.models.optimus.samples import random_model, tiny_config
from hf_ext.sample_text import bundled_sentences, train_bert_vocab, train_gpt2_bpe

LATENT = 6
PAD, BOS, EOS = 60, 61, 62  # tiny_config(50, 60): the decoder's base vocabulary is 60


@pytest.fixture(scope="module")
def model():
    config = tiny_config(50, 60, latent_size=LATENT, hidden_size=48, num_layers=3, num_heads=6)
    return random_model(config, seed=3)


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    sentences = bundled_sentences()
    train_bert_vocab(sentences, folder / "enc")
    train_gpt2_bpe(sentences, folder / "dec")
    gpt2 = GPT2Tokenizer(vocab=str(folder / "dec" / "vocab.json"), merges=str(folder / "dec" / "merges.txt"))
    OptimusProcessor.add_decoder_special_tokens(gpt2)
    return OptimusProcessor(tokenizer=BertTokenizer(vocab=str(folder / "enc" / "vocab.txt")), decoder_tokenizer=gpt2)


def recompute_greedy(model, latent_z, steps):
    """The original's decoding loop: the whole prefix is run again at every step, no cache."""
    ids = torch.full((latent_z.size(0), 1), model.config.decoder.bos_token_id)
    step_logits = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(decoder_input_ids=ids, latent_z=latent_z).logits[:, -1]
        step_logits.append(logits)
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(step_logits, 1)


@pytest.mark.parametrize("memory, embedding", [
    (True, True), pytest.param(True, False, marks=pytest.mark.slow), pytest.param(False, True, marks=pytest.mark.slow),
])
def test_cached_greedy_generation_equals_recompute_loop(model, memory, embedding):
    model.config.latent_as_gpt_memory, model.config.latent_as_gpt_emb = memory, embedding
    try:
        latent = torch.randn(4, LATENT, generator=torch.Generator().manual_seed(0))
        expected_ids, expected_logits = recompute_greedy(model, latent, 7)
        out = model.generate(latent_z=latent, max_new_tokens=7, min_new_tokens=7, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected_ids)
        torch.testing.assert_close(torch.stack(out.logits, 1), expected_logits, atol=1e-5, rtol=1e-5)
    finally:
        model.config.latent_as_gpt_memory = model.config.latent_as_gpt_emb = True


@pytest.mark.slow
def test_each_row_decodes_its_own_latent(model):
    latent = torch.randn(3, LATENT, generator=torch.Generator().manual_seed(1))
    batched = model.generate(latent_z=latent, max_new_tokens=6, min_new_tokens=6)
    for row in range(3):
        alone = model.generate(latent_z=latent[row:row + 1], max_new_tokens=6, min_new_tokens=6)
        assert torch.equal(batched[row], alone[0])


@pytest.mark.slow
def test_beam_search_and_sampling(model):
    latent = torch.randn(2, LATENT, generator=torch.Generator().manual_seed(2))
    beams = model.generate(latent_z=latent, max_new_tokens=5, num_beams=3, num_return_sequences=2,
                           output_scores=True, return_dict_in_generate=True)
    assert beams.sequences.shape[0] == 4
    # the best beam scores at least as well as greedy under the model's own sequence log-probability
    greedy = model.generate(latent_z=latent, max_new_tokens=5, min_new_tokens=5)
    assert torch.isfinite(beams.sequences_scores).all()
    torch.manual_seed(0)
    first = model.generate(latent_z=latent, max_new_tokens=5, do_sample=True, top_k=4, top_p=0.9, temperature=0.7)
    torch.manual_seed(0)
    second = model.generate(latent_z=latent, max_new_tokens=5, do_sample=True, top_k=4, top_p=0.9, temperature=0.7)
    assert torch.equal(first, second)
    assert first[:, 0].eq(model.config.decoder.bos_token_id).all() and greedy.shape == first.shape


@pytest.mark.slow
def test_top_k_one_sampling_is_greedy(model):
    latent = torch.randn(2, LATENT, generator=torch.Generator().manual_seed(4))
    greedy = model.generate(latent_z=latent, max_new_tokens=6, min_new_tokens=6)
    sampled = model.generate(latent_z=latent, max_new_tokens=6, min_new_tokens=6, do_sample=True, top_k=1)
    assert torch.equal(greedy, sampled)


@pytest.mark.slow
def test_left_padded_prompt_matches_unpadded(model):
    bos, pad = model.config.decoder.bos_token_id, model.config.decoder.pad_token_id
    latent = torch.randn(2, LATENT, generator=torch.Generator().manual_seed(5))
    prompt = torch.tensor([[bos, 5, 7, 9], [bos, 11, 12, 13]])
    padded = torch.tensor([[pad, pad, bos, 5, 7, 9], [bos, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    plain = model.generate(input_ids=prompt[:1], latent_z=latent[:1], max_new_tokens=4, min_new_tokens=4,
                           output_logits=True, return_dict_in_generate=True)
    mixed = model.generate(input_ids=padded, attention_mask=mask, latent_z=latent, max_new_tokens=4,
                           min_new_tokens=4, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(plain.sequences[0, 4:], mixed.sequences[0, 6:])
    torch.testing.assert_close(torch.stack(plain.logits, 1)[0], torch.stack(mixed.logits, 1)[0], atol=1e-5,
                               rtol=1e-5)


def test_logits_to_keep(model):
    """generate() asks for the last position's logits only (its prompt step then skips the vocabulary projection of
    every other position); the kept logits equal those of the full forward."""
    latent = torch.randn(2, LATENT, generator=torch.Generator().manual_seed(6))
    ids = torch.tensor([[BOS, 5, 7, 9, 11], [BOS, 12, 13, 14, 15]])
    with torch.no_grad():
        full = model(decoder_input_ids=ids, latent_z=latent).logits
        last = model(decoder_input_ids=ids, latent_z=latent, logits_to_keep=1).logits
        chosen = model(decoder_input_ids=ids, latent_z=latent, logits_to_keep=torch.tensor([0, 3])).logits
    assert last.shape == (2, 1, full.size(-1))
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(chosen, full[:, [0, 3]], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(labels=ids, latent_z=latent, logits_to_keep=1)
    assert model._supports_logits_to_keep()


def test_cache_naming_follows_the_installed_transformers(model, caplog):
    """transformers 5.24 renamed `past_key_values` to `cache`: generation (greedy, beams, left padding) goes through
    without a deprecation message from hf-ext's own calls, the output field has the installed version's name, and a
    user's `past_key_values=` gives the same result as `cache=`."""
    import inspect
    import warnings

    from transformers import GPT2Model

    from hf_ext.models.optimus.modeling_optimus import CACHE_NAME

    assert CACHE_NAME == ("cache" if "cache" in inspect.signature(GPT2Model.forward).parameters else "past_key_values")
    latent = torch.randn(3, LATENT, generator=torch.Generator().manual_seed(5))
    prompt = torch.full((3, 3), PAD)
    prompt[:, -1] = BOS
    mask = torch.zeros(3, 3, dtype=torch.long)
    mask[:, -1] = 1
    with warnings.catch_warnings(), caplog.at_level("WARNING", logger="transformers"):
        warnings.simplefilter("error", FutureWarning)
        greedy = model.generate(latent_z=latent, max_new_tokens=4, do_sample=False)
        model.generate(latent_z=latent, max_new_tokens=4, num_beams=2)
        padded = model.generate(latent_z=latent, input_ids=prompt, attention_mask=mask, max_new_tokens=4,
                                do_sample=False)
    assert torch.equal(padded[:, 2:], greedy)
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]

    with torch.no_grad():
        first = model(labels=greedy[:, :3], latent_z=latent, use_cache=True)
        assert CACHE_NAME in first.keys() and len(first[CACHE_NAME].layers) == model.config.decoder.n_layer
        step = greedy[:, 3:4]
        with_cache = model(decoder_input_ids=step, latent_z=latent, cache=first[CACHE_NAME]).logits
        first = model(labels=greedy[:, :3], latent_z=latent, use_cache=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers' own notice on 5.24+
            with_old_name = model(decoder_input_ids=step, latent_z=latent, past_key_values=first[CACHE_NAME]).logits
    torch.testing.assert_close(with_old_name, with_cache, atol=0, rtol=0)


def test_generate_without_latent_is_refused(model):
    with pytest.raises(ValueError, match="latent_z"):
        model.generate(max_new_tokens=3)


def test_decoder_padding_mask_leaves_real_positions_unchanged(model):
    labels = torch.tensor([[BOS, 3, 4, 5, EOS, PAD, PAD], [BOS, 6, 7, 8, 9, 10, EOS]])
    latent = torch.randn(2, LATENT)
    plain = model(labels=labels, latent_z=latent)
    masked = model(labels=labels, latent_z=latent, decoder_attention_mask=(labels != PAD).long())
    torch.testing.assert_close(masked.logits[0, :5], plain.logits[0, :5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masked.loss_rec, plain.loss_rec, atol=1e-4, rtol=1e-5)


def test_training_samples_the_posterior_and_eval_uses_the_mean(model):
    input_ids = torch.tensor([[2, 7, 8, 9, 3], [2, 10, 3, 0, 0]])
    labels = torch.tensor([[BOS, 3, 4, EOS], [BOS, 6, EOS, PAD]])
    model.eval()
    evaluated = model(input_ids=input_ids, labels=labels)
    torch.testing.assert_close(evaluated.latent_z, evaluated.mean)
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    rates = [m.p for m in dropouts]
    model.train()
    try:
        for m in dropouts:  # so that the reparameterisation noise is the first draw from the seeded generator
            m.p = 0.0
        torch.manual_seed(0)
        trained = model(input_ids=input_ids, labels=labels)
    finally:
        for m, p in zip(dropouts, rates, strict=True):
            m.p = p
        model.eval()
    assert not torch.allclose(trained.latent_z, trained.mean)
    std = (trained.latent_z - trained.mean) / torch.exp(0.5 * trained.logvar)
    torch.manual_seed(0)
    torch.testing.assert_close(std, torch.randn(trained.mean.shape))


def test_loss_combines_reconstruction_and_thresholded_kl(model):
    input_ids = torch.tensor([[2, 7, 8, 9, 3], [2, 10, 3, 0, 0]])
    labels = torch.tensor([[BOS, 3, 4, EOS], [BOS, 6, EOS, PAD]])
    config = model.config
    saved = (config.length_weighted_loss, config.fb_mode, config.dim_target_kl, model.beta)
    try:
        config.length_weighted_loss, config.fb_mode, config.dim_target_kl, model.beta = True, 1, 0.05, 0.7
        out = model(input_ids=input_ids, labels=labels)
        per_dim = kl_per_dimension(out.mean, out.logvar)
        expected_kl = (per_dim * (per_dim > 0.05)).sum(-1)
        torch.testing.assert_close(out.loss_kl, expected_kl)
        lengths = torch.tensor([4.0, 3.0])
        torch.testing.assert_close(out.loss, (out.loss_rec / lengths + 0.7 * expected_kl).mean())
        model.beta = 0.0  # the original trains with plain KL while beta is 0
        torch.testing.assert_close(model(input_ids=input_ids, labels=labels).loss_kl, per_dim.sum(-1))
        config.fb_mode, model.beta = 2, 1.0
        out = model(input_ids=input_ids, labels=labels)
        torch.testing.assert_close(out.loss_kl, 0.5 * out.mean.pow(2).sum(-1))
        assert torch.count_nonzero(out.logvar) == 0
    finally:
        config.length_weighted_loss, config.fb_mode, config.dim_target_kl, model.beta = saved


def test_kl_modes_against_closed_form():
    mean = torch.tensor([[0.5, -1.0, 0.0]])
    logvar = torch.tensor([[0.0, 0.5, -2.0]])
    per_dim = 0.5 * (mean ** 2 + logvar.exp() - logvar - 1)
    torch.testing.assert_close(kl_divergence(mean, logvar, 0), per_dim.sum(-1))
    torch.testing.assert_close(kl_divergence(mean, logvar, 1, 0.3), per_dim[per_dim > 0.3].sum().view(1))
    torch.testing.assert_close(kl_divergence(mean, logvar, 2), torch.tensor([0.625]))


def test_gradients_reach_every_part(model):
    model.train()
    try:
        model.zero_grad()
        out = model(input_ids=torch.tensor([[2, 7, 8, 3]]), labels=torch.tensor([[BOS, 3, 4, EOS]]))
        out.loss.backward()
        for name in ("to_latent.weight", "latent_to_memory.weight", "latent_to_embedding.weight",
                     "encoder.embeddings.word_embeddings.weight", "decoder.h.0.attn.c_attn.weight"):
            grad = model.get_parameter(name).grad
            assert grad is not None and grad.abs().sum() > 0, name
    finally:
        model.zero_grad()
        model.eval()


def test_latent_operations(model):
    z_a, z_b, z_c = torch.randn(3, LATENT).unbind(0)
    path = model.interpolate(z_a, z_b, 5)
    torch.testing.assert_close(path[0], z_a)
    torch.testing.assert_close(path[-1], z_b)
    torch.testing.assert_close(path[2], (z_a + z_b) / 2)
    torch.testing.assert_close(model.analogy(z_a, z_b, z_c, 0.5), z_c + 0.5 * (z_b - z_a))
    assert model.sample_prior(4, torch.Generator().manual_seed(0)).shape == (4, LATENT)
    with pytest.raises(ValueError, match="num_steps"):
        model.interpolate(z_a, z_b, 1)


def test_save_load_and_auto_classes(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(loaded) is OptimusModel
    assert loaded.lm_head.weight.data_ptr() == loaded.decoder.wte.weight.data_ptr()
    labels = torch.tensor([[BOS, 3, 4, EOS]])
    torch.testing.assert_close(loaded(labels=labels, latent_z=torch.ones(1, LATENT)).logits,
                               model(labels=labels, latent_z=torch.ones(1, LATENT)).logits)
    # the classifier loads its encoder and latent projection from the VAE checkpoint
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3).eval()
    assert type(classifier) is OptimusForSequenceClassification
    torch.testing.assert_close(classifier.to_latent.weight, model.to_latent.weight)


@pytest.mark.slow
@pytest.mark.parametrize("feature", ["pooled", "latent_mean"])
def test_sequence_classification_trains(model, feature):
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_labels, config.classifier_feature = 2, feature
    classifier = OptimusForSequenceClassification(config)
    input_ids = torch.tensor([[2, 7, 8, 3], [2, 9, 10, 3], [2, 11, 3, 0], [2, 12, 13, 3]])
    labels = torch.tensor([0, 1, 0, 1])
    optimizer = torch.optim.AdamW(classifier.parameters(), lr=1e-2)
    classifier.train()
    losses = []
    for _ in range(15):
        out = classifier(input_ids=input_ids, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert out.logits.shape == (4, 2)
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.slow
def test_frozen_encoder_trains_only_the_classifier(model):
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_labels, config.freeze_encoder = 2, True
    classifier = OptimusForSequenceClassification(config)
    classifier(input_ids=torch.tensor([[2, 7, 8, 3]]), labels=torch.tensor([1])).loss.backward()
    assert classifier.classifier.weight.grad is not None
    assert all(p.grad is None for p in classifier.encoder.parameters())


def test_processor_builds_both_sides_and_round_trips(processor, tmp_path):
    batch = processor(["a man is playing a guitar .", "a dog runs ."])
    dec = processor.decoder_tokenizer
    assert batch["input_ids"][:, 0].eq(processor.tokenizer.cls_token_id).all()
    assert batch["labels"][:, 0].eq(dec.bos_token_id).all()
    assert batch["labels"][1].tolist().count(dec.pad_token_id) > 0
    assert (dec.pad_token_id, dec.bos_token_id, dec.eos_token_id) == tuple(len(dec) - 3 + i for i in range(3))
    assert processor.batch_decode(batch["labels"]) == ["a man is playing a guitar .", "a dog runs ."]
    processor.save_pretrained(tmp_path)
    reloaded = AutoProcessor.from_pretrained(tmp_path)
    assert isinstance(reloaded, OptimusProcessor)
    again = reloaded(["a man is playing a guitar .", "a dog runs ."])
    assert all(torch.equal(batch[k], again[k]) for k in ("input_ids", "attention_mask", "labels"))


@pytest.mark.slow
def test_latent_space_on_text(processor):
    config = tiny_config(len(processor.tokenizer), len(processor.decoder_tokenizer) - 3, latent_size=LATENT,
                         hidden_size=32, num_layers=2, num_heads=4)
    space = OptimusLatentSpace(random_model(config, seed=0), processor, max_new_tokens=6)
    mean, logvar = space.encode(["a man is playing a guitar .", "a dog runs ."])
    assert mean.shape == logvar.shape == (2, LATENT)
    outputs = space.interpolate("a man is playing a guitar .", "a dog runs .", num_steps=4)
    assert [round(t, 3) for t, _ in outputs] == [0.0, 0.333, 0.667, 1.0]
    assert all(isinstance(text, str) for _, text in outputs)
    assert len(space.reconstruct(["a dog runs ."])) == 1 and isinstance(space.analogy("a", "b", "c"), str)
    assert len(space.sample(3, generator=torch.Generator().manual_seed(0))) == 3
