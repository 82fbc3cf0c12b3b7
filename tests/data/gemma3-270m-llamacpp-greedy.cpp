// Greedy token ids from llama.cpp for tests/data/gemma3-270m-llamacpp.json: llama.cpp's examples/simple/simple.cpp
// (b11434) reduced to ids. For each text argument: its ids as llama_tokenize gives them (add_special and
// parse_special true: <bos> first, as llama-cli and llama-server tokenize a prompt), then -n greedy tokens
// (llama_sampler_init_greedy: the argmax, what --temp 0 / top-k 1 do) from a fresh context. With --tokenize,
// only the ids of each text, without <bos>. One line of JSON per text on stdout.
//
// Build (against a llama.cpp build tree whose `llama` target is built, e.g. bench/peers_build.py's):
//   c++ -O2 -std=c++17 -I $SRC/include -I $SRC/ggml/include gemma3-270m-llamacpp-greedy.cpp \
//       $BUILD/src/libllama.a $BUILD/ggml/src/libggml.a $BUILD/ggml/src/libggml-cpu.a \
//       $BUILD/ggml/src/libggml-base.a -fopenmp -lpthread -ldl -o greedy
#include "llama.h"

#include <clocale>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static void batch_set_tokens(llama_batch_ext * batch, const llama_token * tokens, int32_t n_tokens, llama_pos pos_0) {
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n_tokens; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, tokens[i]);
        const llama_pos pos = pos_0 + i;
        llama_batch_ext_set_pos(batch, idx, &pos);
    }
    llama_batch_ext_set_output_logits(batch, n_tokens - 1, true);
}

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool add_special) {
    const int n = -llama_tokenize(vocab, text.c_str(), text.size(), NULL, 0, add_special, true);
    std::vector<llama_token> ids(n);
    if (n > 0 && llama_tokenize(vocab, text.c_str(), text.size(), ids.data(), ids.size(), add_special, true) < 0) {
        ids.clear();
    }
    return ids;
}

static void print_ids(const char * key, const std::vector<llama_token> & ids) {
    printf("\"%s\": [", key);
    for (size_t i = 0; i < ids.size(); ++i) {
        printf(i ? ", %d" : "%d", ids[i]);
    }
    printf("]");
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    std::string model_path;
    int n_predict = 24, n_threads = 2, i = 1;
    bool only_tokenize = false;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "-m") == 0 && i + 1 < argc) {
            model_path = argv[++i];
        } else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            n_predict = std::stoi(argv[++i]);
        } else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            n_threads = std::stoi(argv[++i]);
        } else if (strcmp(argv[i], "--tokenize") == 0) {
            only_tokenize = true;
        } else {
            break;
        }
    }
    if (model_path.empty() || i == argc) {
        fprintf(stderr, "usage: %s -m model.gguf [-n n_predict] [-t threads] [--tokenize] text...\n", argv[0]);
        return 1;
    }
    llama_backend_init();
    llama_model_params model_params = llama_model_default_params();
    model_params.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), model_params);
    if (model == NULL) {
        fprintf(stderr, "error: unable to load model\n");
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    for (; i < argc; i++) {
        const std::string text = argv[i];
        printf("{");
        if (only_tokenize) {
            print_ids("ids", tokenize(vocab, text, false));
            printf("}\n");
            continue;
        }
        std::vector<llama_token> prompt = tokenize(vocab, text, true);
        const int n_prompt = prompt.size();
        llama_context_params ctx_params = llama_context_default_params();
        ctx_params.n_ctx = n_prompt + n_predict;
        ctx_params.n_batch = n_prompt;
        ctx_params.n_threads = ctx_params.n_threads_batch = n_threads;
        llama_context * ctx = llama_init_from_model(model, ctx_params);
        llama_sampler * smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(smpl, llama_sampler_init_greedy());
        llama_batch_ext * batch = llama_batch_ext_init(ctx);
        batch_set_tokens(batch, prompt.data(), n_prompt, 0);
        std::vector<llama_token> out;
        for (int n_pos = 0, n_tokens = n_prompt; (int) out.size() < n_predict; ) {
            if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) {
                fprintf(stderr, "error: llama_process failed\n");
                return 1;
            }
            n_pos += n_tokens;
            llama_token id = llama_sampler_sample(smpl, ctx, -1);
            out.push_back(id);
            if (llama_vocab_is_eog(vocab, id)) {
                break;
            }
            batch_set_tokens(batch, &id, 1, n_pos);
            n_tokens = 1;
        }
        print_ids("prompt_ids", prompt);
        printf(", ");
        print_ids("ids", out);
        printf("}\n");
        fflush(stdout);
        llama_batch_ext_free(batch);
        llama_sampler_free(smpl);
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
