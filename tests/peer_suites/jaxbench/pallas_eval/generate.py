"""Fixture: the lines of a JAXBench generation script the collector reads, the output tokens each
model's answer was allowed (data_gen.collect puts it beside the truncated answers' lengths)."""


def ask_openai(client, messages):
    return client.chat.completions.create(model="fixture", messages=messages, max_completion_tokens=16384)


def ask_gemini(model, prompt, config):
    return model.generate_content(prompt, generation_config=config(temperature=0.0, max_output_tokens=16384))
