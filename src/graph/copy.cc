#include "graph/copy.h"

namespace kiln {

Status copy_nodes(const Graph& from, Graph& into, std::map<const Value*, Value*>& map,
                  const std::function<std::string(const Value*)>& name) {
  for (const Node* m : from.nodes()) {
    std::vector<Value*> ins;
    for (const Value* v : m->inputs()) {
      if (v == nullptr) {
        ins.push_back(nullptr);
        continue;
      }
      auto it = map.find(v);
      if (it == map.end()) return internal_error() << "copying " << m->describe() << ": it reads an unmapped value";
      ins.push_back(it->second);
    }
    std::vector<std::string> outs;
    for (const Value* o : m->outputs()) outs.push_back(o == nullptr ? std::string() : name(o));
    Node* copy = into.add_node(m->op_type(), ins, outs, m->domain(), m->name());
    for (const auto& [key, a] : m->attrs()) copy->set_attr(key, a);
    for (size_t k = 0; k < m->num_outputs(); ++k)
      if (m->output(k) != nullptr) map[m->output(k)] = copy->output(k);
  }
  return Status::ok();
}

}  // namespace kiln
