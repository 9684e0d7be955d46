#include "graph/copy.h"

namespace kiln {

Status copy_nodes(const std::vector<const Node*>& nodes, Graph& into, std::map<const Value*, Value*>& map,
                  const std::function<std::string(const Value*)>& name,
                  const std::function<Value*(const Value*)>& unmapped) {
  for (const Node* m : nodes) {
    std::vector<Value*> ins;
    for (const Value* v : m->inputs()) {
      if (v == nullptr) {
        ins.push_back(nullptr);
        continue;
      }
      auto it = map.find(v);
      if (it == map.end()) {
        Value* added = unmapped ? unmapped(v) : nullptr;
        if (added == nullptr)
          return internal_error() << "copying " << m->describe() << ": it reads an unmapped value '" << v->name() << "'";
        it = map.emplace(v, added).first;
      }
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

Status copy_nodes(const Graph& from, Graph& into, std::map<const Value*, Value*>& map,
                  const std::function<std::string(const Value*)>& name) {
  std::vector<Node*> all = from.nodes();
  return copy_nodes(std::vector<const Node*>(all.begin(), all.end()), into, map, name);
}

}  // namespace kiln
